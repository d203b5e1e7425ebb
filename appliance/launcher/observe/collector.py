"""The launcher's end of the metrics wire: one TCP server that every rank sends its samples to.

What it owns: ``Collector``, a context manager listening on a port of this machine (all
addresses: each rank is told ``APPLIANCE_METRICS_ADDR=<this machine's address toward its
host>:<port>``) with one thread multiplexing every connection (``selectors``): it reads
newline-delimited JSON, checks the first line of each connection (a ``hello``) and hands every
message to ``JobState.message``. Authentication: when the job has a secret, the hello's ``auth``
must be the hex HMAC-SHA256 of ``b"appliance-metrics"`` keyed with the job secret (its bytes,
decoded from hex; the hex text as bytes is accepted too), and its ``rank`` a whole number.

Refusals: a connection whose hello fails that, that sends something else first, any line that
does not decode to a JSON object (bad UTF-8, bad JSON, nesting too deep, wrong types), a line over
``MAX_LINE`` bytes, no hello within ``hello_s``, or that closes before its hello, is closed and
counted in ``rejected``; it says one line through the elastic driver's ``RefusalLog`` (per peer
address, rate-limited, with a count of what was left out). Nothing a refused connection sent
reaches the job's numbers. At most ``pending_cap`` connections wait for their hello at once (the
oldest is dropped beyond it), and ``MAX_CONNECTIONS`` in all. An accept that fails (``EMFILE``,
``ENFILE``, ``ENOBUFS``, ``ENOMEM``) drops the oldest waiting connection and pauses accepting,
backing off up to ``BACKOFF_MAX_S``, instead of spinning. A connection that ends without a
``bye``, or sends nothing for ``idle_s`` (a rank on a cut or frozen host, whose connection would
otherwise hold its socket for good), is closed and marks its rank disconnected.

Env vars: none. Failure modes: ``OSError`` from ``__enter__`` when no port can be bound; after
that, nothing raised: a bad peer costs only its own connection.
"""
from __future__ import annotations

import errno
import hashlib
import hmac
import json
import selectors
import socket
import sys
import threading
import time
from typing import Callable, Optional

from ..elastic.rendezvous import RefusalLog, pending_cap
from .state import JobState

MAX_LINE = 64 << 10
MAX_CONNECTIONS = 8192
MAX_PENDING = 256          # connections waiting for their hello at once (and at most a quarter of the fd limit)
HELLO_S = 5.0              # a rank says hello as soon as it connects
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 1.0
MAX_RANK = 1 << 20
AUTH_MSG = b"appliance-metrics"
PREFIX = "appliance launch: metrics: "
_PRESSURE = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def auth_digests(secret: Optional[str]) -> set[bytes]:
    """The ``auth`` values (as ASCII bytes) a hello may carry for ``secret`` (empty: no secret)."""
    if not secret:
        return set()
    keys = [secret.encode()]
    try:
        keys.insert(0, bytes.fromhex(secret))
    except ValueError:
        pass
    return {hmac.new(k, AUTH_MSG, hashlib.sha256).hexdigest().encode() for k in keys}


class Refused(Exception):
    """This connection is refused; the message says why."""


def _stderr_line(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _whole(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Conn:
    __slots__ = ("sock", "peer", "buf", "rank", "hello", "seen", "opened")

    def __init__(self, sock: socket.socket, peer: str):
        self.sock, self.peer, self.buf, self.rank, self.hello = sock, peer, b"", None, False
        self.seen = self.opened = time.monotonic()


class Collector:
    """See the module docstring. ``port`` 0: any free port (``self.port`` once entered).
    ``say``: where a refusal line goes (default stderr), each opening with ``prefix``; ``log``: a
    ``RefusalLog`` to use instead."""

    def __init__(self, state: JobState, secret: Optional[str], *, host: str = "", port: int = 0,
                 idle_s: float = 30.0, hello_s: float = HELLO_S, say: Optional[Callable[[str], None]] = None,
                 prefix: str = PREFIX, log: Optional[RefusalLog] = None):
        self.state = state
        self.idle_s = idle_s  # a connection silent this long is closed (a rank on a cut or frozen host)
        self.hello_s = hello_s
        self.log = log or RefusalLog(say or _stderr_line, prefix=prefix)
        self._digests = auth_digests(secret)
        self._bind = (host, port)
        self.port = 0
        self.rejected = 0
        self.messages = 0
        self.accept_errors = 0
        self.max_pending = pending_cap(MAX_PENDING)
        self._sel: Optional[selectors.BaseSelector] = None
        self._listener: Optional[socket.socket] = None
        self._wake_r: Optional[socket.socket] = None
        self._wake_w: Optional[socket.socket] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._conns: dict[int, _Conn] = {}
        self._pending: dict[int, _Conn] = {}   # waiting for their hello, oldest first
        self._latest: dict[int, _Conn] = {}    # rank -> its newest connection
        self._accept_at = 0.0                  # accepting paused until then (fd or memory pressure)
        self._backoff = BACKOFF_MIN_S

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
        self.log.drain()

    # -- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._step():
                    return
            except Exception as e:  # noqa: BLE001 - the loop outlives anything a peer or the machine does
                self.log.admit("(collector)", f"{self.log.prefix}{type(e).__name__}: {e!s:.200} (going on)")
                self._stop.wait(BACKOFF_MAX_S)

    def _step(self) -> bool:
        now = time.monotonic()
        if self._accept_at and now >= self._accept_at:
            self._accept_at = 0.0
            self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        timeout = 1.0 if not self._accept_at else max(0.0, min(1.0, self._accept_at - now))
        for key, _ in self._sel.select(timeout=timeout):
            if key.data == "accept":
                self._accept()
            elif key.data == "wake":
                return True
            elif key.data.sock.fileno() >= 0:
                self._serve(key.data)
        now = time.monotonic()
        for c in list(self._pending.values()):
            if now - c.opened > self.hello_s:
                self._refuse(c, f"no hello within {self.hello_s:g} s")
        for c in [c for c in self._conns.values() if c.hello and now - c.seen > self.idle_s]:
            self._drop(c)
        self.log.flush()
        return False

    def _accept(self) -> None:
        for _ in range(256):  # then the others get their turn
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                if e.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                self._pause(e)
                return
            self._backoff = BACKOFF_MIN_S
            c = _Conn(sock, peer[0])
            if len(self._conns) >= MAX_CONNECTIONS:
                self._refuse(c, f"more than {MAX_CONNECTIONS} connections", registered=False)
                continue
            sock.setblocking(False)
            self._conns[sock.fileno()] = c
            self._pending[sock.fileno()] = c
            self._sel.register(sock, selectors.EVENT_READ, c)
            while len(self._pending) > self.max_pending:
                self._refuse(next(iter(self._pending.values())),
                             f"dropped: more than {self.max_pending} connections waited for their hello")

    def _pause(self, e: OSError) -> None:
        """Accepting failed (fd or memory pressure, or anything else): free what strangers hold and
        stop accepting for a while, the wait doubling while it lasts."""
        self.accept_errors += 1
        if self._pending:
            self._refuse(next(iter(self._pending.values())),
                         f"dropped while the collector could not accept ({e.strerror or e})")
        self.log.admit("(accept)", f"{self.log.prefix}cannot accept a connection: {e.strerror or e} "
                                   f"(retrying in {self._backoff:g} s)")
        try:
            self._sel.unregister(self._listener)
        except (KeyError, ValueError):
            pass
        self._accept_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)

    def _serve(self, c: _Conn) -> None:
        try:
            self._read(c)
        except Refused as e:
            self._refuse(c, str(e))

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            if not c.hello:
                raise Refused("closed before its hello")
            self._drop(c)
            return
        c.seen = time.monotonic()
        c.buf += data
        while True:
            end = c.buf.find(b"\n")
            if end < 0:
                if len(c.buf) > MAX_LINE:
                    raise Refused(f"a line over {MAX_LINE >> 10} KiB")
                return
            line, c.buf = c.buf[:end], c.buf[end + 1:]
            if line.strip():
                self._line(c, line)

    def _line(self, c: _Conn, line: bytes) -> None:
        if len(line) > MAX_LINE:
            raise Refused(f"a line over {MAX_LINE >> 10} KiB")
        try:
            m = json.loads(line)
        except Exception as e:  # noqa: BLE001 - bad UTF-8, bad JSON, nesting too deep (RecursionError), ...
            raise Refused(f"a line that does not decode ({type(e).__name__})") from None
        if not isinstance(m, dict):
            raise Refused(f"a line that is not a JSON object ({type(m).__name__})")
        if not c.hello:
            self._hello(c, m)
        elif m.get("rank") != c.rank:
            m = {**m, "rank": c.rank}  # a connection speaks for the rank of its hello only
        self.messages += 1
        self.state.message(m)

    def _hello(self, c: _Conn, m: dict) -> None:
        """Checks the first line; nothing is recorded unless every check passes."""
        if m.get("kind") != "hello":
            raise Refused(f"a first line that is not a hello (kind {str(m.get('kind'))!r:.40})")
        if not self._authentic(m.get("auth")):
            raise Refused("the hello's auth does not match the job secret")
        rank = m.get("rank")
        if not _whole(rank) or not 0 <= rank < MAX_RANK:
            raise Refused(f"a hello whose rank is not a whole number ({str(rank)!r:.40})")
        for key, ok in (("size", _whole), ("pid", _whole), ("local_rank", _whole), ("round", _whole),
                        ("host", lambda v: isinstance(v, str) and len(v) <= 255)):
            if m.get(key) is not None and not ok(m[key]):
                raise Refused(f"a hello whose {key} is {str(m[key])!r:.40}")
        c.hello, c.rank = True, rank
        self._pending.pop(c.sock.fileno(), None)
        self._latest[rank] = c

    def _authentic(self, auth: object) -> bool:
        if not self._digests:
            return True
        if not isinstance(auth, str) or len(auth) > 256:
            return False
        given = auth.encode("utf-8", "replace")
        return any(hmac.compare_digest(given, d) for d in self._digests)

    def _refuse(self, c: _Conn, why: str, registered: bool = True) -> None:
        self.rejected += 1
        self.log.admit(c.peer, f"{self.log.prefix}refused {c.peer}: {why:.300}")
        if registered:
            self._drop(c, quiet=not c.hello)
        else:
            try:
                c.sock.close()
            except OSError:
                pass

    def _drop(self, c: _Conn, quiet: bool = False) -> None:
        fd = c.sock.fileno()
        if fd >= 0:
            self._conns.pop(fd, None)
            self._pending.pop(fd, None)
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


__all__ = ["Collector", "Refused", "auth_digests", "AUTH_MSG"]
