"""The launcher's one signal trap (``appliance.launcher.signals.SignalTrap``), used by a launch and
by ``appliance primary``: real signals sent to this process."""
from __future__ import annotations

import os
import signal
import threading
import time

from appliance.launcher.signals import SignalTrap


def _wait_for(trap: SignalTrap, count: int) -> None:
    end = time.monotonic() + 5
    while len(trap.received) < count and time.monotonic() < end:
        time.sleep(0.01)


def test_records_signals_while_entered_and_restores_the_handlers():
    # this test's own dispositions: a shell running pytest under `cmd &` hands SIGINT down ignored
    saved = {s: signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
             for s in (signal.SIGTERM, signal.SIGINT)}
    before = {s: signal.getsignal(s) for s in SignalTrap.SIGNALS}
    previous_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # ignored (nohup): stays ignored
    try:
        with SignalTrap() as trap:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGHUP)
            _wait_for(trap, 2)
            time.sleep(0.05)
        assert trap.received == [signal.SIGTERM, signal.SIGINT]
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
        assert signal.getsignal(signal.SIGINT) == before[signal.SIGINT]
    finally:
        signal.signal(signal.SIGHUP, previous_hup)
        for s, h in saved.items():
            signal.signal(s, h)


def test_installs_nothing_outside_the_main_thread_or_when_disabled():
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def in_thread():
        with SignalTrap() as trap:
            seen.append(signal.getsignal(signal.SIGTERM))
            seen.append(trap.received)

    t = threading.Thread(target=in_thread)
    t.start()
    t.join(5)
    assert seen == [before, []]
    with SignalTrap(enabled=False):
        assert signal.getsignal(signal.SIGTERM) == before
