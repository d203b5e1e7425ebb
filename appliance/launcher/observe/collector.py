"""The launcher's end of the metrics wire: one TCP server that every rank sends its samples to.

What it owns: ``Collector``, a context manager listening on a port of this machine (all
addresses: each rank is told ``APPLIANCE_METRICS_ADDR=<this machine's address toward its
host>:<port>``) with one thread multiplexing every connection (``selectors``): it reads
newline-delimited JSON, checks the first line of each connection (a ``hello``) and hands every
message to ``JobState.message``. Authentication: when the job has a secret, the hello's ``auth``
must be the hex HMAC-SHA256 of ``b"appliance-metrics"`` keyed with the job secret (its bytes,
decoded from hex; the hex text as bytes is accepted too); a connection that fails it, sends
something else first, or sends a line over ``MAX_LINE`` bytes is closed and counted in
``rejected``. A connection that ends without a ``bye``, or sends nothing for ``idle_s`` (a rank
on a cut or frozen host, whose connection would otherwise hold its socket for good), is closed
and marks its rank disconnected.

Env vars: none. Failure modes: ``OSError`` from ``__enter__`` when no port can be bound; after
that, nothing raised: a bad peer costs only its own connection.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import selectors
import socket
import threading
import time
from typing import Optional

from .state import JobState

MAX_LINE = 64 << 10
MAX_CONNECTIONS = 8192
AUTH_MSG = b"appliance-metrics"


def auth_digests(secret: Optional[str]) -> set[str]:
    """The ``auth`` values a hello may carry for ``secret`` (empty: the job has no secret)."""
    if not secret:
        return set()
    keys = [secret.encode()]
    try:
        keys.insert(0, bytes.fromhex(secret))
    except ValueError:
        pass
    return {hmac.new(k, AUTH_MSG, hashlib.sha256).hexdigest() for k in keys}


class _Conn:
    __slots__ = ("sock", "buf", "rank", "hello", "seen")

    def __init__(self, sock: socket.socket):
        self.sock, self.buf, self.rank, self.hello = sock, b"", None, False
        self.seen = time.monotonic()


class Collector:
    """See the module docstring. ``port`` 0: any free port (``self.port`` once entered)."""

    def __init__(self, state: JobState, secret: Optional[str], *, host: str = "", port: int = 0,
                 idle_s: float = 30.0):
        self.state = state
        self.idle_s = idle_s  # a connection silent this long is closed (a rank on a cut or frozen host)
        self._digests = auth_digests(secret)
        self._bind = (host, port)
        self.port = 0
        self.rejected = 0
        self.messages = 0
        self._sel: Optional[selectors.BaseSelector] = None
        self._listener: Optional[socket.socket] = None
        self._wake_r: Optional[socket.socket] = None
        self._wake_w: Optional[socket.socket] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._conns: dict[int, _Conn] = {}
        self._latest: dict[int, _Conn] = {}   # rank -> its newest connection

    def __enter__(self) -> "Collector":
        lst = socket.create_server(self._bind, family=socket.AF_INET, backlog=1024, reuse_port=False)
        lst.setblocking(False)
        self._listener, self.port = lst, lst.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(lst, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, name="observe-collector", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(5)
        self._thread = None
        for c in list(self._conns.values()):
            self._drop(c, quiet=True)
        for s in (self._listener, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
        self._sel.close()

    # -- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    return
                else:
                    self._read(key.data)
            now = time.monotonic()
            for c in [c for c in self._conns.values() if now - c.seen > self.idle_s]:
                self._drop(c)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if len(self._conns) >= MAX_CONNECTIONS:
                sock.close()
                self.rejected += 1
                continue
            sock.setblocking(False)
            c = _Conn(sock)
            self._conns[sock.fileno()] = c
            self._sel.register(sock, selectors.EVENT_READ, c)

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(c)
            return
        c.seen = time.monotonic()
        c.buf += data
        while True:
            end = c.buf.find(b"\n")
            if end < 0:
                if len(c.buf) > MAX_LINE:
                    self.rejected += 1
                    self._drop(c)
                return
            line, c.buf = c.buf[:end], c.buf[end + 1:]
            if line.strip() and not self._line(c, line):
                self._drop(c)
                return

    def _line(self, c: _Conn, line: bytes) -> bool:
        try:
            m = json.loads(line)
        except ValueError:
            m = None
        if not isinstance(m, dict):
            if not c.hello:
                self.rejected += 1
                return False
            self.state.bad_messages += 1
            return True
        if not c.hello:
            if m.get("kind") != "hello" or not self._authentic(m.get("auth")):
                self.rejected += 1
                return False
            c.hello = True
            try:
                c.rank = int(m["rank"])
            except (KeyError, TypeError, ValueError):
                self.rejected += 1
                return False
            self._latest[c.rank] = c
        elif m.get("rank") != c.rank:
            m = {**m, "rank": c.rank}  # a connection speaks for the rank of its hello only
        self.messages += 1
        self.state.message(m)
        return True

    def _authentic(self, auth: object) -> bool:
        if not self._digests:
            return True
        return isinstance(auth, str) and any(hmac.compare_digest(auth, d) for d in self._digests)

    def _drop(self, c: _Conn, quiet: bool = False) -> None:
        if c.sock.fileno() >= 0:
            self._conns.pop(c.sock.fileno(), None)
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError, OSError):
            pass
        try:
            c.sock.close()
        except OSError:
            pass
        if c.hello and c.rank is not None and self._latest.get(c.rank) is c:
            del self._latest[c.rank]
            if not quiet:
                self.state.disconnected(c.rank)


__all__ = ["Collector", "auth_digests", "AUTH_MSG"]
