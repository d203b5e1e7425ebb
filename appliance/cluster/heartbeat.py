"""Inside a secondary container: register it on the shared mount and keep the registration alive.

``python -m appliance.cluster.heartbeat --name NAME --port PORT [--slots N] [--shared DIR]``;
the image's entrypoint starts it in the background in ``secondary`` mode, before it hands the
container to sshd. It waits (at most ``--wait`` seconds) until sshd accepts connections on PORT,
then writes ``SHARED/secondaries/NAME.json`` (``mount.registry.Registration``: NAME, the port,
the slots, the container's ``APPLIANCE_CONTAINER``) and touches it every
``APPLIANCE_SECONDARY_HEARTBEAT`` seconds. It stops beating, and exits 0, when the record is
removed (``appliance secondary --stop`` unregisters the secondary before it stops the container)
or replaced by another registration of NAME; on SIGTERM/SIGINT it removes its own record first.
A killed container simply stops beating: the primary's discovery drops it after
``APPLIANCE_SECONDARY_STALE`` seconds.

Env vars: APPLIANCE_SHARED, APPLIANCE_CONTAINER, APPLIANCE_SECONDARY_HEARTBEAT. Failure modes:
exit 1 with one line naming the port when sshd never answers; an error writing the share is said
once per kind and retried at the next beat (the share may come back).
"""
from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
import time
from typing import Callable, Optional

from appliance.common.knobs import read
from ..mount import Layout
from ..mount.registry import Registration, beat, register, unregister

PREFIX = "appliance heartbeat:"


def say(text: str) -> None:
    print(f"{PREFIX} {text}", file=sys.stderr, flush=True)


def wait_for_port(port: int, timeout_s: float, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on host:port within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def keep_alive(layout: Layout, reg: Registration, interval_s: float, stop: threading.Event,
               on_error: Callable[[str], None] = say) -> str:
    """Register ``reg`` and beat until ``stop`` is set or the record is no longer ours; why it ended."""
    errors: set[str] = set()

    def attempt(fn) -> Optional[bool]:
        try:
            return fn()
        except OSError as e:
            kind = type(e).__name__
            if kind not in errors:
                errors.add(kind)
                on_error(f"cannot write {layout.secondary_path(reg.name)}: {e} (retrying)")
            return None

    while attempt(lambda: register(layout, reg)) is None:
        if stop.wait(interval_s):
            return "stopped"
    while not stop.wait(interval_s):
        if attempt(lambda: beat(layout, reg)) is False:
            return "its record was removed or replaced"
    return "stopped"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m appliance.cluster.heartbeat")
    p.add_argument("--name", default=socket.gethostname(), help="the host name the primary reaches this secondary by")
    p.add_argument("--port", type=int, required=True, help="its sshd's port")
    p.add_argument("--slots", type=int, default=1)
    p.add_argument("--shared", default=None, help="shared directory (default: APPLIANCE_SHARED)")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for sshd to answer")
    args = p.parse_args(argv)
    layout = Layout(args.shared or read("APPLIANCE_SHARED"))
    reg = Registration.create(args.name, args.port, args.slots, container=read("APPLIANCE_CONTAINER"),
                              hostname=socket.gethostname())
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if not wait_for_port(args.port, args.wait):
        say(f"sshd does not answer on port {args.port} after {args.wait:g} s: {args.name} is not registered")
        return 1
    interval = read("APPLIANCE_SECONDARY_HEARTBEAT") or 1.0
    say(f"registering {args.name} ({args.slots} slot{'s' if args.slots != 1 else ''}, sshd port {args.port}) "
        f"in {layout.secondaries}, a heartbeat every {interval:g} s")
    why = keep_alive(layout, reg, interval, stop)
    if why == "stopped":
        unregister(layout, reg.name, reg.token)
    say(f"{args.name}: no longer beating: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
