"""The launcher's signal trap: SIGINT, SIGTERM and SIGHUP recorded while a job runs.

What it owns: ``SignalTrap``, a context manager used by ``run.py`` (one job) and by the cluster
plane's ``appliance primary`` (which forwards what it records to its container). On enter, in
the main thread only, it installs a handler for each of ``SIGNALS`` that appends the signal
number to ``received`` (nothing else happens in the handler; the caller's loop decides); a
signal that is ignored (``nohup``, ``cmd &``) stays ignored. On exit it restores the previous
handlers. Outside the main thread, or with ``enabled=False``, it installs nothing and
``received`` stays empty.

Env vars: none. Failure modes: none raised.
"""
from __future__ import annotations

import signal
import threading


class SignalTrap:
    """Records SIGINT/SIGTERM/SIGHUP while entered; restores the previous handlers after."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, enabled: bool = True):
        self.received: list[int] = []
        self._enabled = enabled and threading.current_thread() is threading.main_thread()
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: object) -> None:
        self.received.append(signum)

    def __enter__(self) -> "SignalTrap":
        if self._enabled:
            for s in self.SIGNALS:
                if signal.getsignal(s) is not signal.SIG_IGN:  # respect nohup and `cmd &`
                    self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)  # type: ignore[arg-type]
        self._previous.clear()
