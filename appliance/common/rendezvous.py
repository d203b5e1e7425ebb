"""The elastic rendezvous protocol: what an elastic job's driver and its workers say to each other.

The driver (the launcher, ``appliance.launcher.elastic``) serves it; every worker
(``appliance.runtime.elastic``) connects to ``APPLIANCE_ELASTIC_ADDR``. It lives on the ground
floor because both planes speak it; it imports no plane.

Framing: a 4-byte big-endian length, then that many bytes of one UTF-8 JSON object; a length
above ``MAX_FRAME`` (``MAX_HELLO`` for the worker's hello, the one frame a stranger can send) is
refused before anything is read or allocated.

Handshake: both sides prove they hold the job's secret without sending it (HMAC-SHA256 over a
fresh nonce of the other side, the job id and the worker number)::

    driver -> worker  {"v": 1, "nonce": N1}
    worker -> driver  {"v": 1, "job": J, "worker": W, "nonce": N2, "proof": HMAC(s, "worker", J, W, N1)}
    driver -> worker  {"proof": HMAC(s, "driver", J, W, N2)}      (or {"error": why}, then it closes)

Then one request per connection:

- ``{"op": "join", "last": R, "reason": "start"|"error"|"hosts", "port": P, "addr": A, "lost": [r...]}``:
  the worker wants the newest round after round R (0: it never had one), because it starts, its
  runtime failed, or hosts changed; ``lost``: ranks of round R its runtime found silent past the
  heartbeat timeout. ``port``: a free port on its data address ``A``, where it
  hosts the round's store should it become rank 0. While the driver holds the request it sends ``{"wait": true}``
  every ``KEEPALIVE_S``; the answer is one of ``{"round": ROUND}`` (the worker's place: ``round``,
  ``job_id``, ``rank``, ``size``, ``local_rank``, ``local_size``, ``cross_rank``, ``cross_size``,
  ``host``, ``data_addr``, ``store`` ("addr:port") and ``sync``: whether every member must take
  the state of the round's rank 0), ``{"removed": why}`` (this worker is not part of the job any
  more) or ``{"error": why}`` (the job is failing or ending).
- ``{"op": "leave"}``: the worker was sent SIGTERM and asks to leave the job at its round's next
  commit (held and kept alive as a join is); the answer is ``{"leave": true}`` (taken: its next
  join is answered ``removed``) or ``{"error": why}`` (refused: the driver is stopping it, or the
  job is ending).
- ``{"op": "watch"}``: the worker's notification stream. The driver pushes
  ``{"hosts_updated": {"timestamp": T, "result": F, "round": R}}`` (F: Horovod's
  ``HostUpdateResult`` flags, for the members of round R) and ``{"wait": true}`` keepalives.

Env vars: none. Failure modes: ``RendezvousError`` for a closed connection, a timeout, a
malformed or oversized frame (anything that does not decode: bad UTF-8, bad JSON, nesting too
deep) or a failed proof (the message says which); nothing else escapes the handshake.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import struct
import time
from typing import Any

VERSION = 1
MAX_FRAME = 1 << 20
MAX_HELLO = 4096           # a worker's hello is far smaller; a stranger cannot make the driver hold more
KEEPALIVE_S = 2.0          # the driver's "wait" frames while it holds a request or a watch
SILENCE_S = 15.0           # a worker gives up on a driver it has not heard from for this long
_LEN = struct.Struct(">I")


class RendezvousError(RuntimeError):
    """The rendezvous connection failed (closed, timed out, malformed, or not the job's)."""


def proof(secret: bytes, side: str, job: str, worker: int, nonce: str) -> str:
    msg = "\0".join((side, job, str(int(worker)), nonce)).encode("utf-8", "surrogatepass")
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


class Channel:
    """One framed connection (see the module docstring)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send(self, obj: dict) -> None:
        body = json.dumps(obj, separators=(",", ":")).encode()
        if len(body) > MAX_FRAME:
            raise RendezvousError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
        try:
            self.sock.sendall(_LEN.pack(len(body)) + body)
        except OSError as e:
            raise RendezvousError(f"connection lost while sending: {e.strerror or e}") from None

    def _read(self, n: int, deadline: float | None) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise RendezvousError("timed out waiting for the other side")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(n - len(buf))
            except socket.timeout:
                raise RendezvousError("timed out waiting for the other side") from None
            except OSError as e:
                raise RendezvousError(f"connection lost: {e.strerror or e}") from None
            if not chunk:
                raise RendezvousError("connection closed by the other side")
            buf += chunk
        return bytes(buf)

    def recv(self, timeout: float | None = None, max_frame: int = MAX_FRAME) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        (length,) = _LEN.unpack(self._read(_LEN.size, deadline))
        if length > max_frame:
            raise RendezvousError(f"frame of {length} bytes announced (at most {max_frame})")
        body = self._read(length, deadline)
        try:
            obj = json.loads(body)
        except Exception as e:  # noqa: BLE001 - bad UTF-8, bad JSON, nesting too deep (RecursionError), ...
            raise RendezvousError(f"malformed frame: {type(e).__name__}: {e!s:.120}") from None
        if not isinstance(obj, dict):
            raise RendezvousError("malformed frame: not an object")
        return obj

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def server_hello(chan: Channel, secret: bytes, job: str, timeout: float = 10.0) -> int:
    """The driver's half of the handshake; returns the worker number the peer proved."""
    nonce = secrets.token_hex(16)
    chan.send({"v": VERSION, "nonce": nonce})
    hello = chan.recv(timeout, MAX_HELLO)
    worker = hello.get("worker")
    if hello.get("v") != VERSION or hello.get("job") != job or not isinstance(worker, int) or isinstance(worker, bool):
        chan.send({"error": "not a worker of this job"})
        raise RendezvousError("a peer that is not a worker of this job")
    given, theirs = hello.get("proof"), hello.get("nonce")
    if not isinstance(theirs, str) or len(theirs) > 256:
        chan.send({"error": "not a worker of this job"})
        raise RendezvousError(f"worker {worker}: a hello without a usable nonce")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode("utf-8", "replace"),
                                                              proof(secret, "worker", job, worker, nonce).encode()):
        chan.send({"error": "the proof of the job secret does not match"})
        raise RendezvousError(f"worker {worker}: the proof of the job secret does not match")
    chan.send({"proof": proof(secret, "driver", job, worker, theirs)})
    return worker


def connect(addr: str, secret: bytes, job: str, worker: int, timeout: float = 10.0) -> Channel:
    """A worker's authenticated connection to the driver at ``addr`` (``host:port``)."""
    host, _, port = addr.rpartition(":")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except (OSError, ValueError) as e:
        raise RendezvousError(f"cannot reach the elastic driver at {addr}: {getattr(e, 'strerror', None) or e}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    chan = Channel(sock)
    try:
        first = chan.recv(timeout)
        if first.get("v") != VERSION or not isinstance(first.get("nonce"), str):
            raise RendezvousError(f"{addr} does not speak the rendezvous protocol {VERSION}")
        mine = secrets.token_hex(16)
        chan.send({"v": VERSION, "job": job, "worker": int(worker), "nonce": mine,
                   "proof": proof(secret, "worker", job, worker, first["nonce"])})
        answer = chan.recv(timeout)
        if "error" in answer:
            raise RendezvousError(f"the elastic driver at {addr} refused worker {worker}: {answer['error']}")
        given = answer.get("proof")
        if not isinstance(given, str) or not hmac.compare_digest(given.encode("utf-8", "replace"),
                                                                  proof(secret, "driver", job, worker, mine).encode()):
            raise RendezvousError(f"{addr} could not prove the job secret: not this job's driver")
    except BaseException:
        chan.close()
        raise
    return chan


def request(chan: Channel, message: dict[str, Any], silence_s: float = SILENCE_S) -> dict:
    """Send ``message`` and return the first answer that is not a keepalive (each must come
    within ``silence_s``)."""
    chan.send(message)
    while True:
        answer = chan.recv(silence_s)
        if not answer.get("wait"):
            return answer


__all__ = ["VERSION", "MAX_FRAME", "MAX_HELLO", "KEEPALIVE_S", "SILENCE_S", "RendezvousError", "Channel", "proof",
           "server_hello", "connect", "request"]
