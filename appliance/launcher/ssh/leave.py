"""Leaving a host: what a Kubernetes worker pod's preStop hook runs before its sshd is stopped.

What it owns: ``leave(roots, timeout_s)``. It finds the ranks the remote stubs run on this host
from their records (``JOB_DIR/rank.N.json``, written by ``remote_stub`` while the rank lives, under
each job directory of ``roots``) that can leave: ranks of elastic jobs started with
APPLIANCE_ELASTIC_LEAVE_ON_TERM in their environment (the launcher sets it on Kubernetes). It
sends SIGTERM to each one's own process (not its process group: a rank's helpers, such as data
loader workers, are its to stop) and waits until their stubs have exited or ``timeout_s`` has
passed. Each such rank asks its driver to leave, trains on to the next commit and exits 0; its
stub reports that and exits. A record of another host (a job directory on a shared filesystem),
whose stub is gone, whose rank is no longer that stub's child (a reused pid), or whose rank
cannot leave (a static job's: stopping it fails its job anyway) is skipped: nothing else is
signalled; so is a record that is not a small regular JSON file (read without blocking: a FIFO
there cannot hold the command past its bound). Ranks of this user only (the records are in a
per-user directory).

``appliance leave [--timeout S] [--job-dir DIR]`` runs it (``python -m appliance.launcher.ssh.leave``
too). Env vars: APPLIANCE_JOB_DIR (the launcher's root of job directories, when it set one;
``remote_stub``'s default root is always searched). Failure modes: ``ValueError`` from ``leave``
for a timeout that is not a finite number from 0. The exit status, which a preStop hook's log
shows, is 0 when every rank found has left, or when none was found (one line says so: a pod with
no rank of a job is nothing to wait for); 1 at the timeout, with one line naming the ranks still
running; 2 for a ``--timeout`` that is not a finite number from 0 or a ``--job-dir`` that is not a
directory (one line each): Kubernetes reports a non-zero preStop exit as a ``FailedPreStopHook``
event with that line, and stops the container all the same.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import signal
import socket
import sys
import tempfile
import time
from typing import Iterable, Sequence

from appliance.common.knobs import read
from appliance.mount.atomic import read_small

DEFAULT_TIMEOUT_S = 50.0  # under the manifests' terminationGracePeriodSeconds (60): sshd still gets its turn
POLL_S = 0.1
PID_MAX = 1 << 22  # the kernel's highest pid_max
LEAVE_VAR = "APPLIANCE_ELASTIC_LEAVE_ON_TERM"


def default_roots() -> list[str]:
    """Where stubs of this user record their ranks: APPLIANCE_JOB_DIR, then the stub's default."""
    roots = [read("APPLIANCE_JOB_DIR") or "", os.path.join(tempfile.gettempdir(), f"appliance-{os.getuid()}", "jobs")]
    return list(dict.fromkeys(r for r in roots if r))


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == b"Z" else int(fields[1])


MAX_RECORD_BYTES = 64 * 1024  # a stub's record is a few hundred bytes


def _records(roots: Iterable[str]) -> list[tuple[str, dict]]:
    """(path, record) of every readable rank record under ``roots``: never blocks (a FIFO, a
    directory or an unreadable file there is skipped)."""
    out = []
    for root in roots:
        for path in sorted(glob.glob(os.path.join(glob.escape(root), "*", "rank.*.json"))):
            try:
                text, _ = read_small(path, MAX_RECORD_BYTES)
                rec = json.loads(text) if text is not None else None
            except (ValueError, RecursionError):  # NotReadable too
                continue
            if isinstance(rec, dict):
                out.append((path, rec))
    return out


def find(roots: Iterable[str]) -> list[dict]:
    """The records of ranks running now under a live stub of theirs, in ``roots``."""
    found, here = [], socket.gethostname()
    for path, rec in _records(roots):
        try:
            pid, stub = int(rec["pid"]), int(rec["stub_pid"])
        except (ValueError, KeyError, TypeError, OverflowError):
            continue
        if rec.get("host") != here:  # a job directory on a shared filesystem: another host's rank
            continue
        if 0 < pid < PID_MAX and 0 < stub < PID_MAX and _ppid(pid) == stub and _can_leave(pid):
            found.append({**rec, "path": path})
    return found


def _can_leave(pid: int) -> bool:
    """Whether the rank ``pid`` was started with APPLIANCE_ELASTIC_LEAVE_ON_TERM set true."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        return bool(read(LEAVE_VAR, {LEAVE_VAR: env.get(LEAVE_VAR.encode(), b"").decode(errors="replace")}))
    except (OSError, ValueError):  # gone, not ours, or a value that is not a boolean
        return False


def _alive(pid: int) -> bool:
    return _ppid(pid) is not None


def leave(roots: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S, out=sys.stderr) -> int:
    """SIGTERM every recorded rank here; wait for their stubs (see the module docstring)."""
    if not math.isfinite(timeout_s) or timeout_s < 0:
        raise ValueError(f"timeout must be a finite number of seconds from 0, not {timeout_s!r}")
    end = time.monotonic() + timeout_s
    ranks = find(roots)
    if not ranks:
        print(f"appliance leave: no rank to leave on {socket.gethostname()} (no running rank of an appliance job "
              f"recorded under {', '.join(roots) or 'no directory'})", file=out, flush=True)
        return 0
    for rec in ranks:
        try:
            os.kill(int(rec["pid"]), signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    print(f"appliance leave: sent SIGTERM to {len(ranks)} rank(s) here; waiting up to {timeout_s:g} s for "
          "them to leave", file=out, flush=True)
    left = ranks
    while left:
        left = [r for r in left if _alive(int(r["stub_pid"]))]
        if not left:
            break
        if time.monotonic() >= end:
            names = ", ".join(f"rank {r.get('rank')} (pid {r['pid']})" for r in left)
            print(f"appliance leave: still running after {timeout_s:g} s: {names}", file=out, flush=True)
            return 1
        time.sleep(min(POLL_S, max(0.0, end - time.monotonic())))
    print(f"appliance leave: {len(ranks)} rank(s) left", file=out, flush=True)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"seconds to wait for the ranks to leave, a finite number from 0 (default "
                        f"{DEFAULT_TIMEOUT_S:g}: under a pod's terminationGracePeriodSeconds of 60)")
    p.add_argument("--job-dir", action="append", metavar="DIR",
                   help="a root of job directories to search (repeatable; default: APPLIANCE_JOB_DIR and "
                        "$TMPDIR/appliance-UID/jobs); one that is not a directory is an error")


def run(args: argparse.Namespace) -> int:
    if not math.isfinite(args.timeout) or args.timeout < 0:
        print(f"appliance leave: error: --timeout must be a finite number of seconds, 0 or more, not {args.timeout:g}",
              file=sys.stderr)
        return 2
    for root in args.job_dir or ():
        if not os.path.isdir(root):
            why = "not a directory" if os.path.exists(root) else "no such directory"
            print(f"appliance leave: error: --job-dir {root}: {why}", file=sys.stderr)
            return 2
    return leave(args.job_dir or default_roots(), args.timeout)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="appliance leave", allow_abbrev=False,
                                description="SIGTERM this host's ranks of appliance jobs and wait for them to leave.")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
