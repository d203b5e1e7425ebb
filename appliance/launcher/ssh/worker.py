"""A rank on another host: one SSH channel to a remote stub (``remote_stub.py``), seen as a ``Worker``.

What it owns: ``SSHWorker``, the launcher's half of the stub protocol. Starting a rank opens a
session channel, runs ``PYTHON -m appliance.launcher.ssh.remote_stub`` (an argv quoted with
``shlex``, no secret in it) and writes the spec (argv, env with the job secret, cwd, job dir,
grace) as one JSON line on the channel's stdin. Then one thread decodes the stub's frames: worker
output goes to the ``OutputSink`` line by line (``output.Lines``) with the usual
``[rank]<stdout>:`` prefixes, the started frame gives the remote pid, the exited frame the return
code (negative for a signal). A second thread relays (``output.relay``) the stub's own stderr,
which is empty unless the stub itself fails (e.g. ``appliance`` missing there), as the rank's
stderr.

``signal(sig)`` writes ``signal N`` to the stub, which signals the rank's process group on its
host: stopping works without a pty. ``group_alive()`` is true until the stub has exited, which it
does only once nothing of the group is left. Closing the channel or losing the connection makes
the stub stop the group by itself. ``fault`` is the rank's fault report from the exited frame
(a dict, see ``remote_stub.py``), or None.

Heartbeats both ways: the stub sends an ``H`` frame every ~1 s and a third thread here writes
``ping`` every ~1 s. When nothing at all has come from the stub for the spec's ``ssh_timeout``
seconds (``APPLIANCE_SSH_TIMEOUT``; before its first frame at least ``FIRST_FRAME_S``, for an
interpreter starting on a loaded host), the rank is lost: ``wait()`` returns 255 with ``cause``
"became unreachable: no reply over SSH from H for T s", and from then on ``signal()``,
``group_alive()`` and ``drain()`` no longer touch the (probably dead) channel. The stub, hearing
no ``ping`` for as long, stops the rank on its side. Silence is the host's, not this process's:
time in which the check itself ran more than ``STALL_S`` late (the launcher stood still: a C call
holding the GIL, such as a large module's import, or a stopped process) does not count, and bytes
waiting in the connection's socket (``FIONREAD``) that paramiko's transport thread has not read
yet count as a reply.

Env vars: none. Failure modes: a channel that cannot be opened raises ``SpawnError``; a stub
that ends without an exit frame, a lost connection or a silent one makes ``wait()`` return 255
with ``cause`` naming the host and the reason; a command that cannot start returns 127/126 with
``cause``.
"""
from __future__ import annotations

import fcntl
import functools
import json
import shlex
import socket
import struct
import termios
import threading
import time
from typing import Mapping, Sequence

from .remote_stub import EXITED, HEARTBEAT_S, STARTED, STDERR, STDOUT, FrameDecoder
from .connection import Connection, SSHFailure
from ..output import Lines, OutputSink, relay
from ..workers import SpawnError

LOST = 255
FIRST_FRAME_S = 30.0
STALL_S = 0.5  # the silence check (every 0.1 s) this late: the launcher itself stood still


def _bytes_waiting(chan) -> bool:
    """Bytes from the host in the kernel's buffer of the connection's socket (or, through a jump
    host, in its tunnel channel) that paramiko's transport thread has not taken yet."""
    try:
        sock = chan.get_transport().sock
        if isinstance(sock, socket.socket):
            return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0] > 0
        return bool(sock.recv_ready())
    except Exception:  # noqa: BLE001 - a closed transport or socket: no evidence either way
        return False


class _StderrTail:
    """File-like reader of the channel's stderr for ``relay()``, keeping the last lines. It reads
    the channel itself (paramiko's ``makefile_stderr`` file, left to the garbage collector at
    exit, prints an ignored exception from its ``__del__``)."""

    def __init__(self, chan):
        self._chan = chan
        self._buf = b""
        self._eof = False
        self.tail: list[str] = []

    def readline(self, limit: int) -> bytes:
        while b"\n" not in self._buf[:limit] and len(self._buf) < limit and not self._eof:
            try:
                data = self._chan.recv_stderr(1 << 16)
            except Exception as e:  # noqa: BLE001 - a dying transport raises assorted errors: EOF for relay()
                raise OSError(f"stderr channel: {e}") from None
            if not data:
                self._eof = True
            self._buf += data
        end = self._buf.find(b"\n", 0, limit)
        cut = end + 1 if end >= 0 else min(limit, len(self._buf))
        data, self._buf = self._buf[:cut], self._buf[cut:]
        if data:
            self.tail = (self.tail + [data.decode(errors="replace").strip()])[-3:]
        return data

    def close(self) -> None:
        self._buf, self._eof = b"", True


class SSHWorker:
    """A remote rank (see the module docstring); implements ``workers.Worker``."""

    def __init__(self, rank: int, host: str, conn: Connection, stub_argv: Sequence[str],
                 spec: Mapping[str, object], sink: OutputSink):
        self.rank, self.host, self.pid = rank, host, -1
        self.cause: str | None = None
        self.fault: dict | None = None
        self.remote_host: str = ""
        sink.open_rank(rank)
        self._conn = conn
        self._timeout = float(spec.get("ssh_timeout") or 0.0)  # 0: no silence watchdog
        self._heard = self._checked = time.monotonic()
        self._framed = False  # a first frame arrived
        self._silent = threading.Event()
        self._send_lock = threading.Lock()
        try:
            self._chan, self._token = conn.open_session()
        except SSHFailure as e:
            raise SpawnError(rank, host, str(e), LOST) from None
        self._lock = threading.Lock()
        self._code: int | None = None
        self._exited = threading.Event()
        self._done = threading.Event()
        try:
            self._chan.exec_command(shlex.join([str(a) for a in stub_argv]))
            self._chan.sendall(json.dumps(dict(spec)).encode() + b"\n")
        except Exception as e:  # noqa: BLE001 - paramiko raises several kinds; all mean "could not start"
            self._chan.close()
            conn.release(self._token)
            raise SpawnError(rank, host, f"cannot start the remote stub on {host}: {e}", LOST) from None
        self._stderr = _StderrTail(self._chan)
        self._threads = [
            threading.Thread(target=self._read, args=(sink,), name=f"ssh-{rank}", daemon=True),
            threading.Thread(target=relay, args=(self._stderr, functools.partial(sink.line, rank, "stderr")),
                             name=f"ssh-err-{rank}", daemon=True),
            threading.Thread(target=self._ping, name=f"ssh-ping-{rank}", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read(self, sink: OutputSink) -> None:
        decoder = FrameDecoder()
        lines = {STDOUT: Lines(functools.partial(sink.line, self.rank, "stdout")),
                 STDERR: Lines(functools.partial(sink.line, self.rank, "stderr"))}
        try:
            while True:
                try:
                    data = self._chan.recv(1 << 16)
                except Exception:  # noqa: BLE001 - a dying transport raises assorted errors: treat as EOF
                    data = b""
                if not data:
                    break
                self._heard, self._framed = time.monotonic(), True
                try:
                    frames = decoder.feed(data)
                except ValueError as e:
                    self._finish(LOST, f"sent garbled data through its remote stub ({e})")
                    break
                for kind, payload in frames:
                    if kind in lines:
                        lines[kind].feed(payload)
                    elif kind == STARTED:
                        info = json.loads(payload)
                        self.pid, self.remote_host = int(info["pid"]), str(info.get("host", ""))
                    elif kind == EXITED:
                        info = json.loads(payload)
                        error = info.get("error")
                        self.fault = info["fault"] if isinstance(info.get("fault"), dict) else None
                        self._finish(int(info["returncode"]), f"could not start: {error}" if error else None)
        finally:
            for ln in lines.values():
                ln.flush()
            if not self._exited.is_set():
                self._finish(LOST, self._lost_reason())
            self._done.set()
            try:
                self._chan.close()
            except Exception:  # noqa: BLE001 - the transport is already gone (EOFError): nothing to close
                pass
            self._conn.release(self._token)

    def _ping(self) -> None:
        while not self._done.wait(HEARTBEAT_S) and not self._silent.is_set():
            if not self._send(b"ping\n"):
                return

    def _send(self, data: bytes) -> bool:
        with self._send_lock:
            try:
                self._chan.sendall(data)
                return True
            except Exception:  # noqa: BLE001 - a closed channel: the stub stops the group by itself
                return False

    def silent_s(self) -> float:
        """Seconds since anything came from the stub (which sends a heartbeat every HEARTBEAT_S), this
        process's own stalls not counted (see ``_check_silence``)."""
        try:
            if self._chan.recv_ready() or self._chan.recv_stderr_ready():
                return 0.0
        except Exception:  # noqa: BLE001 - a closed channel: the reader thread reports that
            pass
        silent = time.monotonic() - self._heard
        return 0.0 if silent > HEARTBEAT_S * 1.5 and _bytes_waiting(self._chan) else silent

    def _check_silence(self) -> None:
        now = time.monotonic()
        late = now - self._checked
        self._checked = now
        if late > STALL_S:  # this process stood still (a C call holding the GIL, a stopped launcher):
            self._heard += late - STALL_S  # not the host's silence (its frames may wait unread); only the
            # excess, so that a launcher always late still counts most of a real cut's silence
        try:  # bytes waiting in the channel: the stub is there, only our reader is slow (a blocked stdout)
            if self._chan.recv_ready() or self._chan.recv_stderr_ready():
                self._heard = now
        except Exception:  # noqa: BLE001 - a closed channel: the reader thread reports that
            pass
        limit = self._timeout if self._framed else max(self._timeout, FIRST_FRAME_S)
        if now - self._heard > limit and _bytes_waiting(self._chan):
            self._heard = now  # the host sent something our transport thread has not read yet
        silent_s = now - self._heard
        if silent_s > limit:
            self._finish(LOST, f"became unreachable: no reply over SSH from {self.host} for {self._timeout:.1f} s",
                         silent=True)

    def _lost_reason(self) -> str:
        for t in self._threads[1:2]:
            t.join(1.0)  # the stub's last words, if any
        self._chan.status_event.wait(1.0)  # exit-status may trail the end of output a little
        status = self._chan.exit_status if self._chan.exit_status_ready() else None
        if not self._conn.alive() or status is None:
            return f"lost the SSH connection to {self.host}"
        tail = "; ".join(x for x in self._stderr.tail if x)
        return f"ended without a report from its remote stub (status {status})" + (f": {tail}" if tail else "")

    def _finish(self, code: int, cause: str | None, silent: bool = False) -> bool:
        """Record the rank's end (the first report wins); True when this one was recorded."""
        with self._lock:
            if self._exited.is_set():
                return False
            if silent:
                self._silent.set()  # before the waiters wake: from now on nothing touches the channel
            self._code, self.cause = code, cause
            self._exited.set()
            return True

    # -- Worker ---------------------------------------------------------------------------
    def wait(self) -> int:
        while not self._exited.wait(0.1):
            if self._timeout > 0:
                self._check_silence()
        assert self._code is not None
        return self._code

    def signal(self, sig: int) -> None:
        if self._done.is_set() or self._silent.is_set():
            return
        self._send(f"signal {int(sig)}\n".encode())

    def group_alive(self) -> bool:
        # Silent: the stub stops the group on its side; nothing here can reach it any more.
        return not self._done.is_set() and not self._silent.is_set()

    def drain(self, timeout: float) -> None:
        if self._silent.is_set():
            return
        self._done.wait(timeout)
        for t in self._threads:
            t.join(0.5 if self._done.is_set() else 0.0)
