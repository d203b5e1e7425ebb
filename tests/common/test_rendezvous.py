"""The elastic rendezvous protocol (``appliance.common.rendezvous``) against the driver's real server
(``appliance.launcher.elastic.rendezvous``) over real sockets: both sides prove the job secret, a
stranger or a wrong secret is refused without reaching the driver, frames are bounded before they
are read, a held join is kept alive and answered, and notifications reach a watch stream."""
from __future__ import annotations

import secrets
import socket
import struct
import threading

import pytest

from appliance.common import rendezvous as rdv
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
