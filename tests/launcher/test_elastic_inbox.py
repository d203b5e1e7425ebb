"""The elastic driver's one inbox (``appliance.launcher.elastic.driver``): the worker waiter posts
every rank's exit there as an ``Exited`` event with its handle, the way the rendezvous, the
discovery poller and the host checks post theirs. Pure logic: a mechanism stand-in whose
``wait`` hands out exits (the real ones are exercised by test_elastic_local.py)."""
from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace

from appliance.launcher.elastic.driver import wait_exits
from appliance.launcher.elastic.events import Exited


class Exits:
    """``wait(timeout)`` as a mechanism's: the next exit, or None after the timeout."""

    def __init__(self, exits):
        self.exits = list(exits)
        self.lock = threading.Lock()

    def wait(self, timeout: float):
        with self.lock:
            if self.exits:
                return self.exits.pop(0)
        time.sleep(timeout)
        return None


def test_the_worker_waiter_posts_each_exit_to_the_inbox_and_stops_when_told():
    a, b = SimpleNamespace(rank=3, cause=""), SimpleNamespace(rank=5, cause="host b stopped answering")
    mech, inbox, stop = Exits([(a, 0), (b, 255)]), queue.Queue(), threading.Event()
    waiter = threading.Thread(target=wait_exits, args=(mech, inbox, stop), daemon=True)
    waiter.start()
    try:
        got = [inbox.get(timeout=5.0) for _ in range(2)]
    finally:
        stop.set()
        waiter.join(timeout=5.0)
    assert got == [(Exited(3, 0, ""), a), (Exited(5, 255, "host b stopped answering"), b)]
    assert not waiter.is_alive() and inbox.empty()
