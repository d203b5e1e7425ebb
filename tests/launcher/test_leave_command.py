"""``appliance leave`` (``appliance.launcher.ssh.leave``) with real processes: stand-in stubs (a
Python parent that starts its "rank", records it as ``remote_stub`` does in ``JOB_DIR/rank.N.json``
and exits when the rank has) in a job directory of the test's own.

What is asserted: only a rank started with APPLIANCE_ELASTIC_LEAVE_ON_TERM, on this host, still
the child of the stub its record names, gets SIGTERM; the command returns once that stub has
exited (exit 0) or says which ranks still run at its timeout (exit 1); a host with nothing to
leave says so (exit 0); a ``--timeout`` that is not a finite number from 0 (nan, inf, -1) or a
``--job-dir`` that is not a directory is one line and exit 2, before any signal; junk records
(binary, wrong types, a FIFO, a directory, ``/dev/zero``) are skipped without a wait. Over real
sshd hosts and a real elastic job: ``ssh/test_elastic_leave_ssh.py``.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures.elastic import alive

pytestmark = pytest.mark.timeout(60)

STUB = r'''
import json, os, signal, subprocess, sys
record, host, leaves, rank = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
env = dict(os.environ, APPLIANCE_ELASTIC_LEAVE_ON_TERM="1" if leaves else "0")
# the "rank": SIGTERM makes it exit 0 after a moment (as a rank leaving at its next commit) or, when
# it cannot leave, it ignores nothing and dies of it
code = ("import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.3), sys.exit(0)))\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n")
rank_proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
rank_proc.stdout.readline()
tmp = record + ".tmp"
with open(tmp, "w") as f:
    json.dump({"rank": int(rank), "pid": rank_proc.pid, "pgid": rank_proc.pid, "stub_pid": os.getpid(),
               "host": host, "argv0": sys.executable}, f)
os.replace(tmp, record)
print("recorded", flush=True)
rank_proc.wait()
os.unlink(record)
'''


class Stubs:
    def __init__(self, root: Path):
        self.job = root / "job1"
        self.job.mkdir(parents=True)
        self.procs: list[tuple[subprocess.Popen, int]] = []  # (stub, its rank's pid)

    def start(self, rank: int, host: str | None = None, leaves: bool = True) -> tuple[subprocess.Popen, int]:
        record = self.job / f"rank.{rank}.json"
        p = subprocess.Popen([sys.executable, "-c", STUB, str(record), host or socket.gethostname(),
                              "1" if leaves else "0", str(rank)], stdout=subprocess.PIPE, text=True)
        self.procs.append((p, 0))
        assert p.stdout.readline().strip() == "recorded"
        self.procs[-1] = (p, json.loads(record.read_text())["pid"])
        return self.procs[-1]

    def close(self) -> None:
        for p, rank in self.procs:
            if p.poll() is None and rank:  # its rank is its child: still ours to kill
                os.kill(rank, signal.SIGKILL)
            p.kill()
            p.wait()


@pytest.fixture
def stubs(tmp_path):
    s = Stubs(tmp_path / "jobs")
    yield s
    s.close()


def leave(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "appliance", "leave", "--job-dir", str(root), *args],
                          capture_output=True, text=True, timeout=30)


def test_only_this_hosts_ranks_that_can_leave_get_sigterm_and_the_command_waits_for_their_stubs(stubs, tmp_path):
    leaving, leaving_rank = stubs.start(0)
    static, static_rank = stubs.start(1, leaves=False)          # a static job's rank: left alone
    other, other_rank = stubs.start(2, host="another-host")     # a shared job directory: not this host's
    t0 = time.monotonic()
    r = leave(tmp_path / "jobs", "--timeout", "20")
    assert r.returncode == 0, r.stderr
    assert "sent SIGTERM to 1 rank(s) here" in r.stderr, r.stderr
    assert leaving.poll() is not None and not alive(leaving_rank)   # it waited for the stub to exit
    assert time.monotonic() - t0 < 10
    assert static.poll() is None and alive(static_rank) and other.poll() is None and alive(other_rank)


def test_a_record_whose_rank_is_not_its_stubs_child_is_skipped(stubs, tmp_path):
    p, rank = stubs.start(0)
    record = stubs.job / "rank.0.json"
    rec = json.loads(record.read_text())
    record.write_text(json.dumps({**rec, "stub_pid": os.getpid()}))  # a reused pid: not its parent
    r = leave(tmp_path / "jobs", "--timeout", "5")
    assert r.returncode == 0 and "sent SIGTERM" not in r.stderr, r.stderr
    assert alive(rank) and p.poll() is None


def test_ranks_still_running_at_the_timeout_are_named_and_bad_timeouts_refused(stubs, tmp_path):
    p, rank = stubs.start(0)
    os.kill(rank, signal.SIGSTOP)  # a rank that cannot act on SIGTERM before the timeout
    try:
        r = leave(tmp_path / "jobs", "--timeout", "1")
    finally:
        os.kill(rank, signal.SIGCONT)
    assert r.returncode == 1 and f"still running after 1 s: rank 0 (pid {rank})" in r.stderr, r.stderr
    p.wait(10)  # SIGTERM was delivered; once continued it leaves
    r = leave(tmp_path / "jobs", "--timeout", "-1")
    assert r.returncode == 2 and r.stderr.strip() == "appliance leave: error: --timeout must be a finite number of " \
                                                     "seconds, 0 or more, not -1"


def _say_no_rank(r: subprocess.CompletedProcess, *roots: Path) -> None:
    assert r.returncode == 0 and r.stderr.strip() == f"appliance leave: no rank to leave on {socket.gethostname()} " \
        f"(no running rank of an appliance job recorded under {', '.join(map(str, roots))})", r.stderr


def test_no_job_to_leave_is_said_and_exits_0(tmp_path):
    # l01: a host with no ranks, under the default roots; l06 (leave twice) is the same line
    env = {k: v for k, v in os.environ.items() if k != "APPLIANCE_JOB_DIR"}
    r = subprocess.run([sys.executable, "-m", "appliance", "leave"], capture_output=True, text=True, timeout=30,
                       env={**env, "TMPDIR": str(tmp_path)})
    _say_no_rank(r, tmp_path / f"appliance-{os.getuid()}" / "jobs")
    (tmp_path / "empty").mkdir()
    _say_no_rank(leave(tmp_path / "empty"), tmp_path / "empty")


# l02 and kin: an argument that cannot be right is refused with one line, exit 2, before any signal
REFUSED = {
    "l02 --job-dir that does not exist": (("--job-dir", "{tmp}/nosuch"),
                                          "appliance leave: error: --job-dir {tmp}/nosuch: no such directory"),
    "--job-dir a file": (("--job-dir", "{tmp}/jobs/job1/rank.0.json"),
                         "appliance leave: error: --job-dir {tmp}/jobs/job1/rank.0.json: not a directory"),
    "l03 --timeout -1": (("--timeout", "-1"),
                         "appliance leave: error: --timeout must be a finite number of seconds, 0 or more, not -1"),
    "l04b --timeout nan": (("--timeout", "nan"),
                           "appliance leave: error: --timeout must be a finite number of seconds, 0 or more, not nan"),
    "l04c --timeout inf": (("--timeout", "inf"),
                           "appliance leave: error: --timeout must be a finite number of seconds, 0 or more, not inf"),
    "l04 --timeout abc": (("--timeout", "abc"),
                          "appliance leave: error: argument --timeout: invalid float value: 'abc'"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_bad_arguments_are_refused_before_any_rank_is_signalled(stubs, tmp_path, case):
    args, line = REFUSED[case]
    p, rank = stubs.start(0)  # l07b: a rank that would be waited for without bound
    r = subprocess.run([sys.executable, "-m", "appliance", "leave", "--job-dir", str(tmp_path / "jobs"),
                        *(a.format(tmp=tmp_path) for a in args)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == line.format(tmp=tmp_path), r.stderr
    assert alive(rank) and p.poll() is None


def test_leave_twice_and_a_zero_timeout(stubs, tmp_path):
    p, rank = stubs.start(0)
    os.kill(rank, signal.SIGSTOP)
    try:
        r = leave(tmp_path / "jobs", "--timeout", "0")                      # l07c
    finally:
        os.kill(rank, signal.SIGCONT)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == \
        f"appliance leave: still running after 0 s: rank 0 (pid {rank})", r.stderr
    p.wait(10)
    _say_no_rank(leave(tmp_path / "jobs"), tmp_path / "jobs")               # l06: nothing left to leave


def _junk(job: Path) -> None:
    for i, data in enumerate([bytes(range(256)), b'{"pid": "x", "stub_pid": 1}', b"[]", b"null",
                              json.dumps({"pid": 1, "stub_pid": 0, "host": socket.gethostname()}).encode(),
                              json.dumps({"pid": 1e30, "stub_pid": 1e30, "host": socket.gethostname()}).encode(),
                              b'{"pid": NaN, "stub_pid": Infinity}', b"[" * 100000, b"x" * (1 << 20)]):
        (job / f"rank.{10 + i}.json").write_bytes(data)
    (job / "rank.20.json").mkdir()
    os.mkfifo(job / "rank.21.json")                                         # l11: never opened blocking
    (job / "rank.22.json").symlink_to("/dev/zero")


def test_junk_records_are_skipped_without_a_wait_and_the_rank_beside_them_leaves(stubs, tmp_path):
    # l09, l11: binary, wrong types, pid 1 / stub 0, a FIFO, a directory, /dev/zero next to a real rank
    p, rank = stubs.start(0)
    _junk(stubs.job)
    t0 = time.monotonic()
    r = leave(tmp_path / "jobs", "--timeout", "3")
    assert time.monotonic() - t0 < 5, r.stderr
    assert r.returncode == 0 and "sent SIGTERM to 1 rank(s) here" in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "appliance leave: 1 rank(s) left", r.stderr
    assert p.poll() is not None and not alive(rank)
    t0 = time.monotonic()
    _say_no_rank(leave(tmp_path / "jobs", "--timeout", "3"), tmp_path / "jobs")  # only junk: nothing to leave
    assert time.monotonic() - t0 < 5
