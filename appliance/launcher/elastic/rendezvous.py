"""The driver's rendezvous server: where an elastic job's workers ask for their round and listen
for host changes.

What it owns: ``RendezvousServer``, a TCP listener on every interface of the launcher's machine
(workers on this machine reach it at 127.0.0.1, those on other hosts at the address their SSH
connection came from) with one thread per connection. Each connection proves the job secret
(``appliance.common.rendezvous``: HMAC over nonces, both ways) and then makes one request; the
server turns it into a call on its ``handler`` (the driver) and writes the answer back:

- ``join``: ``handler.join(worker, message) -> Ticket``; the server sends a keepalive every
  ``KEEPALIVE_S`` until the ticket's answer is set, then the answer, then closes.
- ``watch``: ``handler.watch(worker, Stream)``; the server thread then waits until the stream is
  closed or the connection drops, sending keepalives; the handler pushes notifications through
  ``Stream.push``.

A peer that fails the handshake is dropped with one line on stderr per peer address (at most
``MAX_STRANGER_LINES`` in all). Env vars: none. Failure modes: ``OSError`` when it cannot listen;
nothing a peer sends can stop the server.
"""
from __future__ import annotations

import socket
import sys
import threading
from typing import Any, Protocol

from appliance.common.rendezvous import KEEPALIVE_S, Channel, RendezvousError, server_hello

MAX_STRANGER_LINES = 20


class Ticket:
    """A held join request: the driver sets ``answer`` once and the server sends it."""

    def __init__(self) -> None:
        self.answer: dict | None = None
        self.event = threading.Event()

    def set(self, answer: dict) -> None:
        if not self.event.is_set():
            self.answer = answer
            self.event.set()


class Stream:
    """A worker's notification stream (its ``watch`` connection)."""

    def __init__(self, worker: int, chan: Channel):
        self.worker, self._chan = worker, chan
        self._lock = threading.Lock()
        self.closed = threading.Event()

    def push(self, message: dict) -> bool:
        """Send one message; False (and closed) when the connection is gone."""
        with self._lock:
            if self.closed.is_set():
                return False
            try:
                self._chan.send(message)
                return True
            except RendezvousError:
                self.closed.set()
                return False

    def close(self) -> None:
        self.closed.set()


class Handler(Protocol):
    def join(self, worker: int, message: dict) -> Ticket: ...

    def watch(self, worker: int, stream: Stream) -> None: ...


class RendezvousServer:
    """Listens on ``host`` (default: every interface) at an ephemeral port; ``close()`` stops it."""

    def __init__(self, handler: Handler, secret: bytes, job: str, host: str = "0.0.0.0"):
        self.handler, self.secret, self.job = handler, secret, job
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._strangers = 0
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="elastic-rendezvous", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                sock, peer = self._sock.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.add(sock)
            threading.Thread(target=self._serve, args=(sock, peer), name="elastic-conn", daemon=True).start()

    def _serve(self, sock: socket.socket, peer: Any) -> None:
        chan = Channel(sock)
        try:
            try:
                worker = server_hello(chan, self.secret, self.job)
            except RendezvousError as e:
                self._stranger(peer, str(e))
                return
            message = chan.recv(30.0)
            op = message.get("op")
            if op == "join":
                ticket = self.handler.join(worker, message)
                while not ticket.event.wait(KEEPALIVE_S):
                    if self._closed.is_set():
                        return
                    chan.send({"wait": True})
                chan.send(ticket.answer or {"error": "no answer"})
            elif op == "watch":
                stream = Stream(worker, chan)
                self.handler.watch(worker, stream)
                while not stream.closed.wait(KEEPALIVE_S) and not self._closed.is_set():
                    stream.push({"wait": True})
            else:
                chan.send({"error": f"unknown request {op!r}"})
        except RendezvousError:
            pass  # the worker went away; the driver learns of it from the process
        finally:
            with self._lock:
                self._conns.discard(sock)
            chan.close()

    def _stranger(self, peer: Any, why: str) -> None:
        with self._lock:
            self._strangers += 1
            n = self._strangers
        if n <= MAX_STRANGER_LINES:
            print(f"appliance launch: elastic rendezvous: refused {peer[0]}: {why}", file=sys.stderr, flush=True)

    def close(self) -> None:
        self._closed.set()
        for step in (lambda: self._sock.shutdown(socket.SHUT_RDWR), self._sock.close):
            try:
                step()  # shutdown wakes the accepting thread
            except OSError:
                pass
        self._thread.join(2.0)
        with self._lock:
            conns = list(self._conns)
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> "RendezvousServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["RendezvousServer", "Stream", "Ticket", "Handler"]
