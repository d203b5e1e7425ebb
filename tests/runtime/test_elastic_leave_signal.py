"""An elastic worker's SIGTERM handler (``appliance.runtime.elastic.Session``, with
APPLIANCE_ELASTIC_LEAVE_ON_TERM) against a real rendezvous server (``RendezvousServer`` with a
handler of the test's, real sockets and the job secret's handshake), in a child process that
sends itself SIGTERM.

What is asserted: a leave the driver takes keeps the process alive (one line says it leaves at
its next commit; a handler the program had installed before, typically one that exits, is not
run); a second SIGTERM, a refused leave or a driver that cannot be reached are handed on as
without the handler: to the program's handler, else the signal ends the process; without the
variable no handler is installed. The whole path (the driver's
transition, the commit, exit 0) is in ``tests/launcher/test_elastic_leave.py``.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

from appliance.launcher.elastic.rendezvous import RendezvousServer, Ticket

pytestmark = pytest.mark.timeout(60)

SECRET, JOB = "00ff" * 8, "job1"

CHILD = r'''
import os, signal, sys, time
from appliance.runtime.elastic import Session
if sys.argv[1] == "user":
    signal.signal(signal.SIGTERM, lambda *_: print("user handler", flush=True))
s = Session(os.environ)
s.started()
for _ in range(int(sys.argv[2])):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
print("alive, leaving" if s.leaving else "alive", flush=True)
'''


class Driver:
    """Answers every leave request with ``answer``; counts them."""

    def __init__(self, answer: dict):
        self.answer, self.leaves = answer, []

    def join(self, worker: int, message: dict) -> Ticket:
        t = Ticket()
        t.set({"error": "no rounds here"})
        return t

    def watch(self, worker, stream) -> None:
        stream.close()

    def leave(self, worker: int) -> Ticket:
        self.leaves.append(worker)
        t = Ticket()
        threading.Timer(0.1, t.set, ({**self.answer},)).start()  # answered a moment later, as the driver does
        return t


def child(addr: str, user: str, terms: int, leave: str = "1") -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOROVOD_ELASTIC": "1", "APPLIANCE_ELASTIC_ADDR": addr,
           "APPLIANCE_ELASTIC_WORKER": "4", "APPLIANCE_JOB_ID": JOB, "APPLIANCE_JOB_SECRET": SECRET,
           "APPLIANCE_ELASTIC_LEAVE_ON_TERM": leave}
    return subprocess.run([sys.executable, "-c", CHILD, user, str(terms)], env=env, capture_output=True, text=True,
                          timeout=30)


@pytest.fixture
def driver():
    def make(answer: dict):
        d = Driver(answer)
        server = RendezvousServer(d, bytes.fromhex(SECRET), JOB, host="127.0.0.1")
        servers.append(server)
        return d, f"127.0.0.1:{server.port}"
    servers: list = []
    yield make
    for s in servers:
        s.close()


def test_a_taken_leave_keeps_the_worker_alive_without_running_the_programs_handler(driver):
    d, addr = driver({"leave": True})
    r = child(addr, "none", 1)
    assert r.returncode == 0 and r.stdout.strip() == "alive, leaving", r
    assert "worker 4 was sent SIGTERM: it leaves the elastic job at its next commit" in r.stderr
    r = child(addr, "user", 1)
    assert r.returncode == 0 and r.stdout.strip() == "alive, leaving", r
    assert d.leaves == [4, 4]


def test_a_second_sigterm_goes_to_the_programs_handler_else_ends_the_worker(driver):
    d, addr = driver({"leave": True})
    r = child(addr, "none", 2)
    assert r.returncode == -signal.SIGTERM and d.leaves == [4], r
    r = child(addr, "user", 2)
    assert r.returncode == 0 and r.stdout.split("\n")[:2] == ["user handler", "alive, leaving"], r
    assert d.leaves == [4, 4]


@pytest.mark.parametrize("how", ["refused", "unreachable"])
def test_a_refused_or_unanswered_leave_ends_the_worker_as_sigterm_does(driver, how):
    d, addr = driver({"error": "the launcher is stopping it"})
    r = child(addr if how == "refused" else "127.0.0.1:1", "none", 1)
    assert r.returncode == -signal.SIGTERM and "leaves" not in r.stderr, r
    r = child(addr if how == "refused" else "127.0.0.1:1", "user", 1)
    assert r.returncode == 0 and r.stdout.split("\n")[:2] == ["user handler", "alive"], r
    assert d.leaves == ([4, 4] if how == "refused" else [])


def test_without_the_variable_sigterm_ends_the_worker_and_nothing_is_asked(driver):
    d, addr = driver({"leave": True})
    r = child(addr, "none", 1, leave="0")
    assert r.returncode == -signal.SIGTERM and d.leaves == [], r
