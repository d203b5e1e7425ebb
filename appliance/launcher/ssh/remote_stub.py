"""The remote stub: runs on a secondary host, one per remote rank, between sshd and the worker.

Started by the launcher as ``PYTHON -m appliance.launcher.ssh.remote_stub`` over an SSH channel (no
arguments, so nothing secret is ever on a command line). What it owns:

- Reading one JSON line from stdin, the *spec* (``argv``, ``env``, ``cwd``, ``rank``,
  ``job_id``, ``job_dir``, ``grace``, ``ssh_timeout``), and starting the worker from it in its own session
  (process group) with exactly that environment on top of the SSH session's, stdin closed. The
  job secret travels only inside that spec, on the encrypted channel.
- Recording ``{pid, pgid, stub_pid, host}`` in ``JOB_DIR/rank.N.json`` on this host while the
  rank's process group lives (default job dir ``$TMPDIR/appliance-UID/jobs/JOB_ID``).
- Relaying the worker's stdout and stderr, and nothing else, as frames on its own stdout:
  ``kind (1 byte) + length (4 bytes, big endian) + payload``, kinds ``O`` (stdout bytes),
  ``E`` (stderr bytes), ``P`` (started: JSON ``{pid, pgid, host}``), ``H`` (heartbeat, empty,
  every ``HEARTBEAT_S``) and ``X`` (exited: JSON ``{returncode, fault}`` with a negative code for
  a signal, or ``{returncode, error}`` when the worker could not start). ``FrameDecoder`` is the
  launcher's half.
- The fault report passthrough: the worker gets ``APPLIANCE_FAULT_FILE`` pointing at a file of
  the stub's own on this host (the launcher's path means nothing here); after the worker exits
  the stub reads it (one JSON object, see the contract in ``runtime``), removes it and sends it as
  ``fault`` in the ``X`` frame (``null`` when the rank wrote none).
- Control lines on stdin after the spec: ``signal N`` sends N to the worker's process group;
  ``ping`` (the launcher's heartbeat, every ~1 s) only proves the launcher is there.
  End of stdin (the launcher died, the connection dropped, the channel was closed), silence on
  stdin for the spec's ``ssh_timeout`` seconds (a network cut: nothing closes anything), or
  SIGTERM, SIGHUP, SIGINT to the stub stop the group: SIGTERM, the spec's grace period, SIGKILL.
  A silent launcher whose host still acknowledges our frames at the TCP level (``tx_queue`` of
  the ``SSH_CONNECTION`` socket in /proc/net/tcp{,6} back to 0 within ``PEER_ACK_S``) stands
  still but is reachable: the stub waits for it up to ``STALLED_LAUNCHER_S`` of silence.
  The worker also gets SIGKILL if the stub itself is killed (``PR_SET_PDEATHSIG``).
- The stub exits only when the worker has exited and no process of its group is left, so the
  launcher can take "the channel closed" as "nothing of this rank runs on that host".

``python -m appliance.launcher.ssh.remote_stub ports ADDR COUNT`` prints free TCP ports on ADDR (JSON).

Env vars: none of its own (the worker's come in the spec). Failure modes: a worker that cannot
start is reported in the ``X`` frame (127 command not found, 126 not executable, 1 missing
working directory) with a message naming host and command; a malformed spec exits 2 with one
line on stderr; nothing is left running when the stub exits, whatever ended it.
"""
from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any

from .. import binding

HEADER = struct.Struct(">cI")
STDOUT, STDERR, STARTED, EXITED, HEARTBEAT = b"O", b"E", b"P", b"X", b"H"
LAST_LINES_S = 0.5  # how long the exit report waits for the rank's last output
KINDS = frozenset({STDOUT, STDERR, STARTED, EXITED, HEARTBEAT})
MAX_PAYLOAD = 1 << 16
HEARTBEAT_S = 1.0  # both ways: the stub's H frames, the launcher's ping lines
PEER_ACK_S = 2.0  # a launcher host that acknowledged nothing for this long is cut off
STALLED_LAUNCHER_S = 30.0  # the longest silence of a launcher whose host still acknowledges
FAULT_VAR = "APPLIANCE_FAULT_FILE"


def ssh_connection(value: str) -> tuple[bytes, int, bytes, int] | None:
    """``SSH_CONNECTION`` ("client_ip client_port server_ip server_port", set by sshd) as packed
    addresses and ports, or None."""
    def packed(ip: str) -> bytes:
        a = ipaddress.ip_address(ip.split("%")[0])
        return (getattr(a, "ipv4_mapped", None) or a).packed

    try:
        cip, cport, sip, sport = value.split()
        return packed(cip), int(cport), packed(sip), int(sport)
    except ValueError:
        return None


def _proc_address(field: str) -> tuple[bytes, int]:
    """An ``ADDR:PORT`` of /proc/net/tcp{,6} (32-bit words in host byte order) -> (packed, port);
    an IPv4-mapped IPv6 address -> its IPv4 address."""
    addr, port = field.split(":")
    packed = b"".join(struct.pack("=I", int(addr[i:i + 8], 16)) for i in range(0, len(addr), 8))
    if len(packed) == 16 and packed[:12] == b"\0" * 10 + b"\xff\xff":
        packed = packed[12:]
    return packed, int(port, 16)


def unacked_bytes(conn: tuple[bytes, int, bytes, int] | None) -> int | None:
    """Bytes sshd has sent on the launcher's connection that its host has not acknowledged yet
    (``tx_queue`` of the socket in /proc/net/tcp{,6}), or None when the socket is not found. A
    launcher host that is reachable acknowledges within a round trip even while the launcher
    process itself stands still; across a network cut the count stays above 0."""
    if conn is None:
        return None
    cip, cport, sip, sport = conn
    want = ((sip, sport), (cip, cport))
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 4 and (_proc_address(fields[1]), _proc_address(fields[2])) == want:
                        return int(fields[4].split(":")[0], 16)
        except (OSError, ValueError):
            continue
    return None


def encode(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


class FrameDecoder:
    """Incremental decoder of the stub's stdout; ``feed(bytes)`` -> complete ``(kind, payload)``s."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self._buf += data
        frames = []
        while len(self._buf) >= HEADER.size:
            kind, length = HEADER.unpack_from(self._buf)
            if kind not in KINDS or length > MAX_PAYLOAD:
                raise ValueError(f"not a stub frame (kind {kind!r}, length {length})")
            if len(self._buf) < HEADER.size + length:
                break
            frames.append((kind, bytes(self._buf[HEADER.size:HEADER.size + length])))
            del self._buf[:HEADER.size + length]
        return frames

    @property
    def pending(self) -> int:
        return len(self._buf)


def default_job_dir(job_id: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"appliance-{os.getuid()}", "jobs", job_id)


class _Out:
    """Frames to our stdout, one writer at a time; remembers when the reader went away."""

    def __init__(self, stream: IO[bytes]):
        self._stream, self._lock = stream, threading.Lock()
        self.broken = threading.Event()

    def send(self, kind: bytes, payload: bytes) -> None:
        for i in range(0, max(len(payload), 1), MAX_PAYLOAD):
            with self._lock:
                if self.broken.is_set():
                    return
                try:
                    self._stream.write(encode(kind, payload[i:i + MAX_PAYLOAD]))
                    self._stream.flush()
                except (OSError, ValueError):
                    self.broken.set()

    def json(self, kind: bytes, obj: dict) -> None:
        self.send(kind, json.dumps(obj).encode())


def _die_with_parent() -> None:
    """In the worker, before exec: SIGKILL when the stub's thread that forked it dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Stub:
    def __init__(self, spec: dict[str, Any], out: _Out):
        self.spec, self.out = spec, out
        self.grace = float(spec.get("grace", 3.0))
        self.timeout = float(spec.get("ssh_timeout") or 0.0)  # 0: no silence watchdog
        self.lost = threading.Event()          # the launcher is gone: stop the group
        self.silent = threading.Event()        # ... and it went silent (its channel may be dead)
        self.heard = time.monotonic()          # last line from the launcher
        self.connection = ssh_connection(os.environ.get("SSH_CONNECTION", ""))
        self.pgid = 0
        self.record = ""
        self.fault_file = ""

    # -- the group ----------------------------------------------------------------------
    def killpg(self, sig: int) -> None:
        if self.pgid:
            try:
                os.killpg(self.pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def group_alive(self) -> bool:
        from ..reaper import pgid_alive
        return bool(self.pgid) and pgid_alive(self.pgid)

    def stop_group(self) -> None:
        """TERM, grace, KILL; returns when the group is gone (bounded)."""
        self.killpg(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.killpg(signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.02)

    def _launcher_gone(self) -> None:
        if not self.lost.is_set():
            self.lost.set()
            threading.Thread(target=self.stop_group, name="stop", daemon=True).start()

    # -- threads --------------------------------------------------------------------------
    def control(self, stdin: "_LineReader") -> None:
        while True:
            line = stdin.readline()
            self.heard = time.monotonic()
            if not line:
                self._launcher_gone()
                return
            words = line.split()
            if len(words) == 2 and words[0] == b"signal" and words[1].isdigit():
                self.killpg(int(words[1]))

    def heartbeat(self, done: threading.Event) -> None:
        """``H`` frames to the launcher (may block on a dead channel: the watchdog is another thread)."""
        while not done.wait(HEARTBEAT_S):
            self.out.send(HEARTBEAT, b"")

    def watchdog(self, done: threading.Event) -> None:
        """When the launcher has been silent for ``timeout`` seconds, stop the group, unless its host
        still acknowledges our frames (then the launcher process stands still, not the network: wait
        up to ``STALLED_LAUNCHER_S``)."""
        acked = float("-inf")  # last time nothing we sent was waiting for the launcher host's ack
        while not done.wait(0.1):
            now = time.monotonic()
            silent_s = now - self.heard
            if silent_s > min(HEARTBEAT_S * 1.5, self.timeout) and unacked_bytes(self.connection) == 0:
                acked = now  # a ping is late, yet its host acknowledges: watched only then (a read of /proc)
            reachable = now - acked <= PEER_ACK_S and silent_s <= STALLED_LAUNCHER_S
            if silent_s > self.timeout and not reachable:
                self.silent.set()
                self._launcher_gone()
                return

    def pump(self, fd: int, kind: bytes) -> None:
        while True:
            try:
                data = os.read(fd, MAX_PAYLOAD)
            except OSError:
                data = b""
            if not data:
                break
            self.out.send(kind, data)
            if self.out.broken.is_set():
                self._launcher_gone()  # keep draining so the worker never blocks on a full pipe
        os.close(fd)

    # -- main -----------------------------------------------------------------------------
    def _write_record(self, pid: int) -> None:
        job_dir = self.spec.get("job_dir") or default_job_dir(str(self.spec.get("job_id") or "job"))
        try:
            os.makedirs(job_dir, mode=0o700, exist_ok=True)
            path = os.path.join(job_dir, f"rank.{int(self.spec['rank'])}.json")
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump({"rank": self.spec["rank"], "pid": pid, "pgid": pid, "stub_pid": os.getpid(),
                           "host": socket.gethostname(), "argv0": self.spec["argv"][0]}, f)
            os.replace(tmp, path)
            self.record = path
        except OSError:
            self.record = ""  # recording is for diagnosis; the stub still owns the group

    def _remove_record(self) -> None:
        if self.record:
            try:
                os.unlink(self.record)
                os.rmdir(os.path.dirname(self.record))  # only when it was the last rank here
            except OSError:
                pass

    def _fault_path(self) -> str:
        """A fresh path for this rank's fault report on this host (its job directory, else a temp dir)."""
        job_dir = self.spec.get("job_dir") or default_job_dir(str(self.spec.get("job_id") or "job"))
        for d in (job_dir, tempfile.gettempdir()):
            try:
                os.makedirs(d, mode=0o700, exist_ok=True)
            except OSError:
                continue
            path = os.path.join(d, f"fault.{int(self.spec['rank'])}.{os.getpid()}.json")
            try:
                os.unlink(path)  # a stale one of a recycled pid; the rank writes it only when it fails
            except OSError:
                pass
            return path
        return ""

    def _read_fault(self) -> dict | None:
        if not self.fault_file:
            return None
        try:
            with open(self.fault_file, encoding="utf-8") as f:
                fault = json.load(f)
        except (OSError, ValueError):
            return None
        finally:
            try:
                os.unlink(self.fault_file)
            except OSError:
                pass
        return fault if isinstance(fault, dict) else None

    def run(self, stdin: "_LineReader") -> int:
        argv, cwd = [str(a) for a in self.spec["argv"]], self.spec.get("cwd") or None
        env = {**os.environ, **{str(k): str(v) for k, v in self.spec.get("env", {}).items()}}
        host = socket.gethostname()
        done = threading.Event()
        threading.Thread(target=self.heartbeat, args=(done,), name="heartbeat", daemon=True).start()
        if self.timeout > 0:
            threading.Thread(target=self.watchdog, args=(done,), name="watchdog", daemon=True).start()
        try:
            return self._run(argv, cwd, env, host, stdin)
        finally:
            done.set()

    def _run(self, argv: list[str], cwd: str | None, env: dict[str, str], host: str, stdin: "_LineReader") -> int:
        if env.get(FAULT_VAR):  # the launcher asks for a report: the rank writes it here, we pass it on
            self.fault_file = self._fault_path()
            env[FAULT_VAR] = self.fault_file
        if cwd is not None and not os.path.isdir(cwd):
            self.out.json(EXITED, {"returncode": 1, "error": f"working directory {cwd!r} does not exist on {host}"})
            return 0
        try:
            with binding.bound(env):
                proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                                        preexec_fn=_die_with_parent)
        except (FileNotFoundError, PermissionError, OSError) as e:
            code = 127 if isinstance(e, FileNotFoundError) else 126
            what = "command not found" if code == 127 else f"cannot execute ({e.strerror})"
            self.out.json(EXITED, {"returncode": code, "error": f"{what} on {host}: {argv[0]!r}"})
            return 0
        self.pgid = proc.pid
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, lambda *_: self._launcher_gone())
        self._write_record(proc.pid)
        self.out.json(STARTED, {"pid": proc.pid, "pgid": proc.pid, "host": host})
        pumps = [threading.Thread(target=self.pump, args=(p.fileno(), k), daemon=True)
                 for p, k in ((proc.stdout, STDOUT), (proc.stderr, STDERR))]
        for t in pumps:
            t.start()
        threading.Thread(target=self.control, args=(stdin,), name="control", daemon=True).start()
        code = proc.wait()
        # Its last lines before its exit report: the pipes end with the rank (a grandchild that
        # holds them open delays the report by at most LAST_LINES_S).
        deadline = time.monotonic() + LAST_LINES_S
        for t in pumps:
            t.join(max(0.0, deadline - time.monotonic()))
        fault = self._read_fault()
        if not self.silent.is_set():  # a silent launcher's channel may be dead: never block on it
            self.out.json(EXITED, {"returncode": code, "fault": fault})
        # Stray members of the group (grandchildren) keep the rank alive until the launcher
        # stops them or goes away; only then does the stub exit.
        while self.group_alive():
            if self.lost.wait(0.05):
                self.stop_group()
                break
        deadline = time.monotonic() + 2.0
        for t in pumps:
            t.join(max(0.0, deadline - time.monotonic()))
        self._remove_record()
        return 0


class _LineReader:
    """Lines from a raw fd (no ``sys.stdin`` buffer: a thread blocked in it breaks interpreter exit)."""

    def __init__(self, fd: int):
        self._fd, self._buf = fd, b""

    def readline(self) -> bytes:
        while b"\n" not in self._buf:
            try:
                data = os.read(self._fd, 1 << 16)
            except OSError:
                data = b""
            if not data:
                line, self._buf = self._buf, b""
                return line
            self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        return line + b"\n"


def _ports(address: str, count: str) -> int:
    from ..ports import pick_free_ports
    print(json.dumps(pick_free_ports(address, int(count))))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ports"] and len(argv) == 3:
        return _ports(argv[1], argv[2])
    if argv:
        print("usage: python -m appliance.launcher.ssh.remote_stub [ports ADDR COUNT] (spec on stdin)",
              file=sys.stderr)
        return 2
    stdin = _LineReader(0)
    try:
        spec = json.loads(stdin.readline())
        if not isinstance(spec, dict) or not spec.get("argv") or "rank" not in spec:
            raise ValueError("needs argv and rank")
    except ValueError as e:
        print(f"appliance remote stub: bad spec on stdin: {e}", file=sys.stderr)
        return 2
    return Stub(spec, _Out(sys.stdout.buffer)).run(stdin)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # daemon threads may still sit in blocking reads: skip interpreter finalization
