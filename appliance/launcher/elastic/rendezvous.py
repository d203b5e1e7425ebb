"""The driver's rendezvous server: where an elastic job's workers ask for their round and listen
for host changes.

What it owns: ``RendezvousServer``, a TCP listener on every interface of the launcher's machine
(workers on this machine reach it at 127.0.0.1, those on other hosts at the address their SSH
connection came from) with one thread per connection. Each connection proves the job secret
(``appliance.common.rendezvous``: HMAC over nonces, both ways) and then makes one request; the
server turns it into a call on its ``handler`` (the driver) and writes the answer back:

- ``join``: ``handler.join(worker, message) -> Ticket``; the server sends a keepalive every
  ``KEEPALIVE_S`` until the ticket's answer is set, then the answer, then closes.
- ``leave``: ``handler.leave(worker) -> Ticket``, answered as a join is (the worker was sent
  SIGTERM and leaves at its next commit).
- ``watch``: ``handler.watch(worker, Stream)``; the server thread then waits until the stream is
  closed or the connection drops, sending keepalives; the handler pushes notifications through
  ``Stream.push``.

A peer that fails the handshake, or sends anything that does not decode, is dropped; the lines
about it go through ``RefusalLog``: per peer address its first ``PER_SOURCE_LINES`` and in all
``TOTAL_LINES`` in each ``LOG_INTERVAL_S``, then one line that says how many were left out and from
where (never interleaved: one lock). At most ``MAX_PENDING`` connections (and at most a quarter
of the soft fd limit) wait for the handshake at once; beyond it the oldest is dropped, so a flood of idle connections cannot use up the
process's file descriptors. The accept loop survives fd and memory pressure (``EMFILE``,
``ENFILE``, ``ENOBUFS``, ``ENOMEM``: it drops the oldest waiting connection, backs off and
retries) and a thread that cannot start. Env vars: none. Failure modes: ``OSError`` when it
cannot listen; nothing a peer sends can stop the server.
"""
from __future__ import annotations

import errno
import resource
import socket
import sys
import threading
import time
from typing import Any, Callable, Protocol

from appliance.common.rendezvous import KEEPALIVE_S, Channel, RendezvousError, server_hello

MAX_PENDING = 512         # connections waiting for the handshake at once (at most a quarter of the fd
                          # limit); beyond it the oldest is dropped
PER_SOURCE_LINES = 3      # refusal lines per peer address in each interval
TOTAL_LINES = 20          # refusal lines in all in each interval
LOG_INTERVAL_S = 60.0
_PREFIX = "appliance launch: elastic rendezvous: "
_TRANSIENT = {errno.EINTR, errno.EAGAIN, errno.ECONNABORTED, errno.EPROTO}
_BACKOFF_MIN_S, _BACKOFF_MAX_S = 0.01, 0.5


class RefusalLog:
    """Bounds the lines strangers can cause (see the module docstring). Pure logic with the clock
    passed in; ``write`` is called with whole lines, under the log's lock; ``prefix`` opens the
    line that says what was left out (the metrics collector and endpoint use it too)."""

    def __init__(self, write: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                 per_source: int = PER_SOURCE_LINES, total: int = TOTAL_LINES, interval_s: float = LOG_INTERVAL_S,
                 prefix: str = _PREFIX):
        self._write, self._clock, self.prefix = write, clock, prefix
        self.per_source, self.total, self.interval_s = per_source, total, interval_s
        self._lock = threading.Lock()
        self._start: float | None = None
        self._printed = 0
        self._printed_by: dict[str, int] = {}
        self._dropped_by: dict[str, int] = {}
        self._dropped = 0
        self.refused = 0  # every refusal, printed or not, for the job's life

    def admit(self, source: str, line: str) -> None:
        with self._lock:
            now = self._clock()
            self._roll(now)
            self.refused += 1
            mine = self._printed_by.get(source, 0)
            if mine < self.per_source and self._printed < self.total:
                self._printed_by[source] = mine + 1
                self._printed += 1
                self._write(line)
                return
            self._dropped += 1
            if len(self._dropped_by) < 4096 or source in self._dropped_by:
                self._dropped_by[source] = self._dropped_by.get(source, 0) + 1

    def flush(self) -> None:
        """Say what was left out once its interval has ended."""
        with self._lock:
            if self._start is not None and self._dropped and self._clock() >= self._start + self.interval_s:
                self._roll(self._clock())

    def drain(self) -> None:
        """Say what was left out so far (the server closes)."""
        with self._lock:
            if self._start is not None and self._dropped:
                self._write(self._summary(self._clock()))
            self._start = None
            self._reset()

    def _roll(self, now: float) -> None:
        if self._start is not None and now < self._start + self.interval_s:
            return
        if self._start is not None and self._dropped:
            self._write(self._summary(now))
        self._start = now
        self._reset()

    def _reset(self) -> None:
        self._printed, self._dropped = 0, 0
        self._printed_by.clear()
        self._dropped_by.clear()

    def _summary(self, now: float) -> str:
        top = sorted(self._dropped_by.items(), key=lambda kv: -kv[1])
        names = " ".join(f"{src} ({n})" for src, n in top[:5]) + (" ..." if len(top) > 5 else "")
        return (f"{self.prefix}left out {self._dropped} more such line(s) in the last {now - self._start:.0f} s, "
                f"from {len(top)} source(s): {names}")


def pending_cap(most: int = MAX_PENDING) -> int:
    """How many unauthenticated connections a server holds at once: ``most``, and at most a quarter
    of the soft fd limit (the metrics collector and endpoint use it too)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return most
    return max(8, min(most, soft // 4))


def _stderr_line(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


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

    def leave(self, worker: int) -> Ticket: ...


class RendezvousServer:
    """Listens on ``host`` (default: every interface) at an ephemeral port; ``close()`` stops it."""

    def __init__(self, handler: Handler, secret: bytes, job: str, host: str = "0.0.0.0",
                 log: RefusalLog | None = None):
        self.handler, self.secret, self.job = handler, secret, job
        self.log = log or RefusalLog(_stderr_line)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(128)
        self._sock.settimeout(1.0)  # the loop wakes to say what the log left out
        self.port = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._pending: dict[socket.socket, Any] = {}  # waiting for the handshake, oldest first
        self._dropped: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.max_pending = pending_cap()
        self._thread = threading.Thread(target=self._accept, name="elastic-rendezvous", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        backoff = _BACKOFF_MIN_S
        while not self._closed.is_set():
            self.log.flush()
            try:
                sock, peer = self._sock.accept()
            except socket.timeout:
                continue
            except OSError as e:
                if self._closed.is_set():
                    return
                if e.errno in _TRANSIENT:
                    continue
                # fd or memory pressure, or anything else: free what strangers hold, wait, retry
                self._drop_oldest(f"dropped while the server could not accept ({e.strerror or e})")
                self.log.admit("(accept)", f"{_PREFIX}cannot accept a connection: {e.strerror or e} (retrying)")
                self._closed.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)
                continue
            backoff = _BACKOFF_MIN_S
            try:
                self._start(sock, peer)
            except Exception as e:  # noqa: BLE001 - memory and the like: this connection is lost, never the loop
                self._forget(sock)
                self.log.admit("(accept)", f"{_PREFIX}cannot serve {peer[0]}: {type(e).__name__}: {e}")
                self._closed.wait(_BACKOFF_MAX_S)

    def _start(self, sock: socket.socket, peer: Any) -> None:
        sock.settimeout(None)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        with self._lock:
            self._conns.add(sock)
            self._pending[sock] = peer
        while len(self._pending) > self.max_pending:
            self._drop_oldest(f"dropped: more than {self.max_pending} connections waited for the handshake")
        try:
            threading.Thread(target=self._serve, args=(sock, peer), name="elastic-conn", daemon=True).start()
        except RuntimeError as e:  # no thread to be had: drop this one and back off
            self._forget(sock)
            self.log.admit("(threads)", f"{_PREFIX}cannot serve {peer[0]}: {e}")
            self._closed.wait(_BACKOFF_MAX_S)

    def _drop_oldest(self, why: str) -> None:
        with self._lock:
            if not self._pending:
                return
            sock = next(iter(self._pending))
            peer = self._pending.pop(sock)
            self._dropped.add(sock)
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes its thread, which closes it
            except OSError:
                pass
        self._refuse(peer, why)

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:  # closed under the lock: no other thread shuts down a reused descriptor
            self._conns.discard(sock)
            self._pending.pop(sock, None)
            self._dropped.discard(sock)
            try:
                sock.close()
            except OSError:
                pass

    def _serve(self, sock: socket.socket, peer: Any) -> None:
        chan = Channel(sock)
        worker = None
        try:
            try:
                worker = server_hello(chan, self.secret, self.job)
            except Exception as e:  # noqa: BLE001 - whatever a stranger sends is a refusal, never a traceback
                with self._lock:
                    dropped = sock in self._dropped
                if not dropped:
                    why = str(e) if isinstance(e, RendezvousError) else f"a frame that does not decode ({type(e).__name__})"
                    self._refuse(peer, why)
                return
            with self._lock:
                self._pending.pop(sock, None)
            message = chan.recv(30.0)
            op = message.get("op")
            if op in ("join", "leave"):
                ticket = self.handler.join(worker, message) if op == "join" else self.handler.leave(worker)
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
                chan.send({"error": f"unknown request {op!r:.80}"})
        except RendezvousError:
            pass  # the worker went away; the driver learns of it from the process
        except Exception as e:  # noqa: BLE001 - one line, rate-limited, never a traceback
            self.log.admit(f"worker {worker}", f"{_PREFIX}worker {worker} ({peer[0]}): {type(e).__name__}: {e!s:.200}")
        finally:
            self._forget(sock)

    def _refuse(self, peer: Any, why: str) -> None:
        self.log.admit(peer[0], f"{_PREFIX}refused {peer[0]}: {why:.300}")

    def close(self) -> None:
        self._closed.set()
        for step in (lambda: self._sock.shutdown(socket.SHUT_RDWR), self._sock.close):
            try:
                step()  # shutdown wakes the accepting thread
            except OSError:
                pass
        self._thread.join(2.0)
        with self._lock:
            for s in self._conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self.log.drain()

    def __enter__(self) -> "RendezvousServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["RendezvousServer", "RefusalLog", "pending_cap", "Stream", "Ticket", "Handler"]
