"""The appliance's own host discovery: the live secondaries on the shared mount, in Horovod's format.

``python -m appliance.cluster.discover [SHARED] [--port PORT] [--stale S]`` prints one
``host:slots`` line per secondary registered under ``SHARED/secondaries/`` (``mount.registry``)
whose heartbeat is younger than ``--stale`` seconds (``APPLIANCE_SECONDARY_STALE``, default 5),
oldest registration first; with ``--port`` only the secondaries whose sshd listens on PORT (the
job's). It is an ordinary host discovery script: ``appliance primary --min-np N`` without
``-H``/``--hostfile`` writes ``JOB_DIR/discover.sh``, which runs it, and passes that as
``--host-discovery-script`` to the launcher, whose elastic driver polls it as it polls any other
(``launcher.elastic.discovery``). ``host_lines()`` is the pure part (registrations and a time in,
lines out).

Env vars: APPLIANCE_SHARED (the default SHARED), APPLIANCE_SECONDARY_STALE. Failure modes: exit 2
with one line when SHARED is not a directory or ``--stale`` is not a positive number; a file under
``secondaries/`` that is not a usable record (``mount.registry``) is skipped with one line on
stderr naming it, and the others are printed; no registration at all prints nothing (the driver
then waits, up to ``--elastic-timeout``, for ``-np`` slots).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Iterable, Optional

from appliance.common.knobs import ConfigError, read
from ..mount import Layout
from ..mount.registry import Registration, is_live, registrations

SCRIPT = "discover.sh"


def host_lines(found: Iterable[tuple[Registration, float]], now: float, stale_after_s: float,
               port: Optional[int] = None) -> list[str]:
    """``host:slots`` of the live registrations in ``found`` (record, heartbeat time), in order,
    each host once (the first record of a name wins)."""
    lines, seen = [], set()
    for reg, beat_at in found:
        if reg.name in seen or not is_live(beat_at, now, stale_after_s):
            continue
        if port is not None and reg.ssh_port != port:
            continue
        seen.add(reg.name)
        lines.append(f"{reg.name}:{reg.slots}")
    return lines


def write_script(job_dir: str, shared: str, port: int, python: str = "/opt/venv/bin/python") -> str:
    """``JOB_DIR/discover.sh``: runs this module for ``shared`` and ``port`` (the image's Python);
    its path."""
    path = os.path.join(job_dir, SCRIPT)
    quoted = "'" + shared.replace("'", "'\\''") + "'"
    text = ("#!/bin/sh\n# The job's host discovery: the secondaries registered on the shared mount "
            "(appliance.cluster.discover).\n"
            f"exec {python} -m appliance.cluster.discover {quoted} --port {int(port)}\n")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
    return path


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m appliance.cluster.discover",
                                description="Print host:slots for every live secondary registered on the shared mount.")
    p.add_argument("shared", nargs="?", help="shared directory (default: APPLIANCE_SHARED)")
    p.add_argument("--port", type=int, help="only the secondaries whose sshd listens on this port")
    p.add_argument("--stale", type=float, help="seconds after the last heartbeat a secondary stops counting "
                                               "(default: APPLIANCE_SECONDARY_STALE)")
    args = p.parse_args(argv)
    try:
        shared = args.shared or read("APPLIANCE_SHARED")
        stale = args.stale if args.stale is not None else read("APPLIANCE_SECONDARY_STALE")
    except ConfigError as e:
        print(f"appliance discover: {e}", file=sys.stderr)
        return 2
    if args.stale is not None and not (math.isfinite(args.stale) and args.stale > 0):
        print(f"appliance discover: --stale must be a positive number of seconds, got {args.stale!r}", file=sys.stderr)
        return 2
    if not os.path.isdir(shared):
        print(f"appliance discover: shared directory {shared} does not exist", file=sys.stderr)
        return 2

    def skipped(path: str, why: str) -> None:
        safe = "".join(c if c.isprintable() else "?" for c in path)  # a file name cannot forge a line
        print(f"appliance discover: skipped {safe}: {why}", file=sys.stderr)

    for line in host_lines(registrations(Layout(shared), on_skip=skipped), time.time(), stale, args.port):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
