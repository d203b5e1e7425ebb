"""The remote stub (``python -m appliance.launcher.ssh.remote_stub``) on this machine, without SSH: its
stdin/stdout are pipes, exactly what sshd gives it. Spec in, frames out, control lines, and the
rule that nothing of the rank survives the stub: on exit, on ``signal N``, on EOF, on SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from appliance.launcher.ssh.remote_stub import EXITED, HEARTBEAT, STARTED, STDERR, STDOUT, FrameDecoder

WORKER = r'''
import os, signal, subprocess, sys, time
out = sys.argv[1]
if "IGNORE_TERM" in os.environ:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(os.path.join(out, "child"), "w") as f:
    f.write(str(child.pid))
print("hello from", os.environ["WHO"], flush=True)
print("to stderr", file=sys.stderr, flush=True)
if os.environ.get("MODE") == "exit":
    sys.exit(3)
time.sleep(60)
'''


class Stub:
    def __init__(self, spec: dict):
        self.p = subprocess.Popen([sys.executable, "-m", "appliance.launcher.ssh.remote_stub"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.p.stdin.write(json.dumps(spec).encode() + b"\n")
        self.p.stdin.flush()
        self.frames: list[tuple[bytes, bytes]] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        d = FrameDecoder()
        while True:
            data = os.read(self.p.stdout.fileno(), 65536)
            if not data:
                break
            with self._cond:
                self.frames += d.feed(data)
                self._cond.notify_all()

    def wait_frame(self, kind: bytes, limit: float = 10.0) -> dict | bytes:
        with self._cond:
            ok = self._cond.wait_for(lambda: any(k == kind for k, _ in self.frames), limit)
        assert ok, (kind, self.frames)
        payload = next(p for k, p in self.frames if k == kind)
        return json.loads(payload) if kind in (STARTED, EXITED) else payload

    def data(self, kind: bytes) -> bytes:
        return b"".join(p for k, p in self.frames if k == kind)

    def kill(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait(5)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def wait_dead(pids, limit=5.0):
    end = time.monotonic() + limit
    while any(alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


@pytest.fixture
def stub(tmp_path):
    started = []

    def start(mode="sleep", ssh_timeout=0.0, worker=WORKER, **env):
        spec = {"rank": 4, "argv": [sys.executable, "-c", worker, str(tmp_path)], "cwd": str(tmp_path),
                "env": {"WHO": "rank4", "MODE": mode, "APPLIANCE_JOB_SECRET": "s3cr3t", **env},
                "job_id": "j1", "job_dir": str(tmp_path / "jobs" / "j1"), "grace": 0.5, "ssh_timeout": ssh_timeout}
        s = Stub(spec)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()
    child = tmp_path / "child"
    if child.exists():
        try:
            os.kill(int(child.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _child(tmp_path) -> int:
    end = time.monotonic() + 10
    while not (tmp_path / "child").exists():
        assert time.monotonic() < end
        time.sleep(0.02)
    return int((tmp_path / "child").read_text())


@pytest.mark.timeout(60)
def test_frames_record_and_exit_code(stub, tmp_path):
    s = stub(mode="exit")
    started = s.wait_frame(STARTED)
    record = tmp_path / "jobs" / "j1" / "rank.4.json"
    exited = s.wait_frame(EXITED)
    assert exited == {"returncode": 3, "fault": None}
    child = _child(tmp_path)
    assert alive(child)  # a stray of the group keeps the rank (and the stub) alive...
    rec = json.loads(record.read_text())
    assert rec["pid"] == rec["pgid"] == started["pid"] and rec["stub_pid"] == s.p.pid
    s.p.stdin.write(b"signal 15\n")  # ...until the launcher stops the group
    s.p.stdin.flush()
    assert s.p.wait(5) == 0 and wait_dead([child]) == []
    assert s.data(STDOUT) == b"hello from rank4\n" and s.data(STDERR) == b"to stderr\n"
    assert s.p.stderr.read() == b""  # the stub itself says nothing
    assert not record.exists() and not record.parent.exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["signal", "eof", "sigterm"])
def test_nothing_survives_stop_eof_or_a_signal_to_the_stub(stub, tmp_path, how):
    s = stub(IGNORE_TERM="1")  # the worker ignores SIGTERM: escalation to SIGKILL after the grace
    pid = s.wait_frame(STARTED)["pid"]
    child = _child(tmp_path)
    start = time.monotonic()
    if how == "signal":
        s.p.stdin.write(b"signal 9\n")
        s.p.stdin.flush()
    elif how == "eof":
        s.p.stdin.close()            # the launcher died or the connection dropped
    else:
        os.kill(s.p.pid, signal.SIGTERM)
    assert s.p.wait(10) == 0
    assert wait_dead([pid, child], 1.0) == []
    assert time.monotonic() - start < 3.0
    code = s.wait_frame(EXITED)["returncode"]
    assert code == -signal.SIGKILL


@pytest.mark.timeout(30)
def test_start_failures_are_reported_in_the_exit_frame(tmp_path):
    for spec, code, words in [
        ({"argv": ["/no/such/program"], "cwd": str(tmp_path)}, 127, "command not found"),
        ({"argv": [str(tmp_path)], "cwd": str(tmp_path)}, 126, "cannot execute"),
        ({"argv": ["true"], "cwd": str(tmp_path / "gone")}, 1, "working directory"),
    ]:
        s = Stub({"rank": 0, "env": {}, **spec})
        try:
            exited = s.wait_frame(EXITED)
            assert exited["returncode"] == code and words in exited["error"], exited
            assert s.p.wait(5) == 0
        finally:
            s.kill()
    p = subprocess.run([sys.executable, "-m", "appliance.launcher.ssh.remote_stub"], input=b"not json\n",
                       capture_output=True)
    assert p.returncode == 2 and b"bad spec" in p.stderr


@pytest.mark.timeout(60)
def test_silent_launcher_makes_the_stub_stop_the_rank_pings_keep_it(stub, tmp_path):
    """A network cut closes nothing: the stub only notices the launcher's pings stopping."""
    s = stub(ssh_timeout=1.5, IGNORE_TERM="1")
    pid = s.wait_frame(STARTED)["pid"]
    child = _child(tmp_path)
    for _ in range(10):  # 3 s of pings, twice the timeout: still running
        s.p.stdin.write(b"ping\n")
        s.p.stdin.flush()
        time.sleep(0.3)
    assert s.p.poll() is None and alive(pid)
    assert sum(1 for k, _ in s.frames if k == HEARTBEAT) >= 2  # the stub's own heartbeat, ~1 s
    start = time.monotonic()  # now silence (stdin stays open)
    assert s.p.wait(10) == 0
    assert wait_dead([pid, child], 1.0) == []
    assert time.monotonic() - start < 1.5 + 0.5 + 1.5  # timeout + grace (TERM ignored) + slack
    assert not (tmp_path / "jobs" / "j1").exists()


FAULT_WORKER = r'''
import json, os, sys, time
path = os.environ["APPLIANCE_FAULT_FILE"]
with open(path + ".tmp", "w") as f:
    json.dump({"rank": 4, "host": "h", "origin_rank": 2, "origin_host": "b", "kind": "peer_lost",
               "message": "rank 2 lost", "time": time.time()}, f)
os.replace(path + ".tmp", path)
with open(os.path.join(sys.argv[1], "fault_path"), "w") as f:
    f.write(path)
sys.exit(1)
'''


@pytest.mark.timeout(30)
def test_fault_report_passes_through_the_exit_frame(stub, tmp_path):
    s = stub(worker=FAULT_WORKER, APPLIANCE_FAULT_FILE="/launcher/side/path.json")
    exited = s.wait_frame(EXITED)
    assert exited["returncode"] == 1
    assert exited["fault"]["origin_rank"] == 2 and exited["fault"]["kind"] == "peer_lost"
    path = (tmp_path / "fault_path").read_text()
    assert path != "/launcher/side/path.json" and not os.path.exists(path)  # the stub's own file, removed
    assert s.p.wait(5) == 0
    s2 = stub(mode="exit", APPLIANCE_FAULT_FILE="")  # empty (the contract's "off"): no file, no fault
    assert s2.wait_frame(EXITED) == {"returncode": 3, "fault": None}
    assert not [n for n in os.listdir(tmp_path / "jobs" / "j1") if n.startswith("fault.")]
