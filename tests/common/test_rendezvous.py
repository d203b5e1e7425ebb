"""The elastic rendezvous protocol (``appliance.common.rendezvous``) against the driver's real server
(``appliance.launcher.elastic.rendezvous``) over real sockets: both sides prove the job secret, a
stranger or a wrong secret is refused without reaching the driver, frames are bounded before they
are read, a held join is kept alive and answered, and notifications reach a watch stream."""
from __future__ import annotations

import resource
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from appliance.common import rendezvous as rdv
from appliance.launcher.elastic import rendezvous as rdv_server
from appliance.launcher.elastic.rendezvous import RendezvousServer, Ticket

pytestmark = pytest.mark.timeout(60)


class Driver:
    """A stand-in driver that records calls and answers joins when told."""

    def __init__(self):
        self.joins, self.streams = [], []
        self.tickets: list[Ticket] = []

    def join(self, worker, message):
        self.joins.append((worker, message))
        t = Ticket()
        self.tickets.append(t)
        return t

    def watch(self, worker, stream):
        self.streams.append((worker, stream))


@pytest.fixture
def server():
    secret = secrets.token_bytes(16)
    driver = Driver()
    s = RendezvousServer(driver, secret, "job1", host="127.0.0.1")
    try:
        yield s, driver, secret
    finally:
        s.close()


def test_a_join_is_held_with_keepalives_and_then_answered(server, monkeypatch):
    s, driver, secret = server
    monkeypatch.setattr("appliance.launcher.elastic.rendezvous.KEEPALIVE_S", 0.05)
    chan = rdv.connect(f"127.0.0.1:{s.port}", secret, "job1", 7)
    got = {}
    t = threading.Thread(target=lambda: got.update(rdv.request(chan, {"op": "join", "last": 0}, silence_s=2.0)))
    t.start()
    for _ in range(100):
        if driver.tickets:
            break
        threading.Event().wait(0.02)
    threading.Event().wait(0.3)  # several keepalives meanwhile; the request is still held
    assert t.is_alive() and driver.joins == [(7, {"op": "join", "last": 0})]
    driver.tickets[0].set({"round": {"rank": 3}})
    t.join(5)
    assert got == {"round": {"rank": 3}}
    chan.close()


def test_a_wrong_secret_is_refused_on_both_sides(server):
    s, driver, secret = server
    with pytest.raises(rdv.RendezvousError, match="refused worker 1"):
        rdv.connect(f"127.0.0.1:{s.port}", b"not the secret", "job1", 1)
    with pytest.raises(rdv.RendezvousError, match="refused worker 1"):
        rdv.connect(f"127.0.0.1:{s.port}", secret, "another-job", 1)
    assert driver.joins == []
    # a driver without the secret cannot pass for the real one either
    impostor = RendezvousServer(Driver(), b"guess", "job1", host="127.0.0.1")
    try:
        with pytest.raises(rdv.RendezvousError):
            rdv.connect(f"127.0.0.1:{impostor.port}", secret, "job1", 1)
    finally:
        impostor.close()


def test_oversized_and_malformed_frames_are_refused_before_reading_them():
    a, b = socket.socketpair()
    try:
        a.sendall(struct.pack(">I", rdv.MAX_FRAME + 1))
        with pytest.raises(rdv.RendezvousError, match="announced"):
            rdv.Channel(b).recv(1.0)
        a.sendall(struct.pack(">I", 3) + b"[1]")
        with pytest.raises(rdv.RendezvousError, match="not an object"):
            rdv.Channel(b).recv(1.0)
        with pytest.raises(rdv.RendezvousError, match="timed out"):
            rdv.Channel(b).recv(0.1)
    finally:
        a.close()
        b.close()


def test_strangers_are_dropped_and_the_server_keeps_serving(server, capfd):
    s, driver, secret = server
    for junk in (b"GET / HTTP/1.0\r\n\r\n", b"\xff" * 64, b""):
        with socket.create_connection(("127.0.0.1", s.port)) as c:
            try:
                c.sendall(junk)
                c.shutdown(socket.SHUT_WR)
                c.recv(4096)
            except OSError:
                pass  # the server hung up first
    chan = rdv.connect(f"127.0.0.1:{s.port}", secret, "job1", 2)
    chan.send({"op": "watch"})
    for _ in range(100):
        if driver.streams:
            break
        threading.Event().wait(0.02)
    worker, stream = driver.streams[0]
    assert worker == 2 and stream.push({"hosts_updated": {"timestamp": 5, "result": 2, "round": 1}})
    while True:
        note = chan.recv(5.0)
        if not note.get("wait"):
            break
    assert note == {"hosts_updated": {"timestamp": 5, "result": 2, "round": 1}}
    chan.close()
    assert "elastic rendezvous: refused 127.0.0.1" in capfd.readouterr().err


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _send_and_wait_for_close(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        try:
            c.sendall(data)
            while c.recv(4096):
                pass
        except OSError:
            pass  # the server hung up first


def _wait(cond, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_frames_that_do_not_decode_are_refusals_never_tracebacks(server, capfd):
    s, driver, secret = server
    deep = _frame(b"[" * 100000 + b"]" * 100000)
    deep_object = _frame(b'{"a":' * 50000 + b"1" + b"}" * 50000)
    bad_utf8 = _frame(b'{"v": 1, "job": "\xff\xfe"}')
    for payload in [deep] * 20 + [deep_object, bad_utf8]:
        _send_and_wait_for_close(s.port, payload)
    # with the job id, a proof that is not ASCII (hmac.compare_digest would raise TypeError on it)
    for proof_value in ("\u00e9" * 64, 5, None, ["x"]):
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
            chan = rdv.Channel(c)
            first = chan.recv(5.0)
            assert "nonce" in first
            chan.send({"v": 1, "job": "job1", "worker": 3, "nonce": "n", "proof": proof_value})
            assert "error" in chan.recv(5.0)
    assert _wait(lambda: s.log.refused >= 26), s.log.refused
    chan = rdv.connect(f"127.0.0.1:{s.port}", secret, "job1", 4)  # and a worker is still served
    chan.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err[:2000]
    refused = [line for line in err.splitlines() if "refused 127.0.0.1" in line]
    assert 1 <= len(refused) <= rdv_server.PER_SOURCE_LINES, err


def test_the_refusal_log_is_per_source_bounded_and_counts_what_it_left_out():
    now = [100.0]
    lines: list[str] = []
    log = rdv_server.RefusalLog(lines.append, clock=lambda: now[0], per_source=3, total=5, interval_s=60.0)
    for i in range(10):
        log.admit("10.0.0.1", f"a{i}")
    log.admit("10.0.0.2", "b0")
    log.admit("10.0.0.2", "b1")
    log.admit("10.0.0.3", "c0")  # over the total
    assert lines == ["a0", "a1", "a2", "b0", "b1"]
    log.flush()  # the interval has not ended: nothing yet
    assert len(lines) == 5
    now[0] += 61.0
    log.flush()
    assert len(lines) == 6 and "left out 8 more such line(s) in the last 61 s, from 2 source(s): " \
        "10.0.0.1 (7) 10.0.0.3 (1)" in lines[-1], lines[-1]
    log.admit("10.0.0.1", "a-new")  # a new interval: the address may speak again
    assert lines[-1] == "a-new"
    for i in range(4):
        log.admit("10.0.0.1", "more")
    log.drain()
    assert "left out 2 more such line(s)" in lines[-1] and log.refused == 18


def test_the_refusal_log_writes_whole_lines_one_at_a_time():
    inside = threading.Lock()
    overlaps = []

    def write(line):
        if not inside.acquire(blocking=False):
            overlaps.append(line)
            return
        try:
            time.sleep(0.0005)
        finally:
            inside.release()

    log = rdv_server.RefusalLog(write, per_source=1000, total=100000)
    threads = [threading.Thread(target=lambda n=n: [log.admit(f"s{n}", f"line {n}") for _ in range(50)])
               for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert overlaps == [] and log.refused == 400


def test_a_thread_that_cannot_start_drops_one_connection_not_the_server(server, monkeypatch, capfd):
    s, driver, secret = server
    real_start = threading.Thread.start
    failures = [1]

    def start(self):
        if self.name == "elastic-conn" and failures:
            failures.pop()
            raise RuntimeError("can't start new thread")
        return real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
        c.settimeout(10)
        assert c.recv(100) == b""  # dropped
    chan = rdv.connect(f"127.0.0.1:{s.port}", secret, "job1", 5)
    chan.close()
    assert "cannot serve 127.0.0.1: can't start new thread" in capfd.readouterr().err


FLOOD_SERVER = r"""
import resource, sys, threading
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
from appliance.launcher.elastic.rendezvous import RendezvousServer, Ticket
class Driver:
    def join(self, worker, message):
        t = Ticket(); t.set({"round": {"rank": worker}}); return t
    def watch(self, worker, stream):
        pass
s = RendezvousServer(Driver(), bytes.fromhex(sys.argv[1]), "job1", host="127.0.0.1")
print(s.port, flush=True)
sys.stdin.read()
s.close()
"""


def test_a_flood_of_idle_connections_under_a_1024_fd_limit_does_not_stop_the_server(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:  # the flood itself needs its descriptors in this process
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    secret = secrets.token_bytes(16)
    err_path = tmp_path / "server.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", FLOOD_SERVER, secret.hex()], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True)
    flood: list[socket.socket] = []
    try:
        port = int(proc.stdout.readline())
        for _ in range(1100):
            c = socket.socket()
            c.settimeout(5)
            try:
                c.connect(("127.0.0.1", port))
            except OSError:
                c.close()
                break  # the backlog is full: the flood is as big as it gets
            flood.append(c)
        assert len(flood) >= 1024 - 64, len(flood)  # the server's fd limit was reached
        time.sleep(0.5)
        # with every flood connection still open, a worker is served at once ...
        chan = rdv.connect(f"127.0.0.1:{port}", secret, "job1", 9, timeout=10.0)
        assert rdv.request(chan, {"op": "join", "last": 0}, silence_s=10.0) == {"round": {"rank": 9}}
        chan.close()
        for c in flood:
            c.close()
        flood.clear()
        # ... and again after it
        chan = rdv.connect(f"127.0.0.1:{port}", secret, "job1", 10, timeout=10.0)
        assert rdv.request(chan, {"op": "join", "last": 0}, silence_s=10.0) == {"round": {"rank": 10}}
        chan.close()
        proc.stdin.close()
        assert proc.wait(timeout=20) == 0
    finally:
        for c in flood:
            c.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err_path.read_text()
    assert "Traceback" not in text and "left out" in text, text[-3000:]


def test_a_hello_bigger_than_any_workers_is_refused_before_it_is_read():
    lines: list[str] = []
    s = RendezvousServer(Driver(), b"secret", "job1", host="127.0.0.1", log=rdv_server.RefusalLog(lines.append))
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
            assert "nonce" in rdv.Channel(c).recv(5.0)
            c.sendall(struct.pack(">I", rdv.MAX_HELLO + 1) + b"{")
            try:
                assert c.recv(4096) == b""  # closed at once, not after the handshake's 10 s
            except ConnectionResetError:
                pass
        assert _wait(lambda: bool(lines)) and f"announced (at most {rdv.MAX_HELLO})" in lines[0], lines
    finally:
        s.close()
