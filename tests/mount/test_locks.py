"""Lock files (appliance/mount/locks.py, layout.py, atomic.py): real files, real processes.

Holders are separate Python processes (killed with SIGKILL to leave a dead holder behind);
remote holders are simulated by records that name another host, judged by their heartbeat.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from appliance.mount import FileLock, Layout, LockHeld, Owner, host_lock, owner as owners, run_lock, save_atomically
from fixtures import ROOT

HOLDER = textwrap.dedent("""
    import sys, time
    from appliance.mount.locks import FileLock
    path, ready, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with FileLock(path, what="holder job", heartbeat_s=0.2, stale_after_s=1.0):
        open(ready, "w").close()
        time.sleep(hold)
""")


def _spawn_holder(path: Path, tmp_path: Path, hold: float = 60.0) -> subprocess.Popen:
    ready = tmp_path / f"ready.{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(ready), str(hold)], env=env)
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert p.poll() is None, f"holder exited early ({p.returncode})"
        assert time.monotonic() < deadline, "holder did not take the lock within 20 s"
        time.sleep(0.02)
    return p


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def test_second_holder_is_refused_and_told_who_holds(tmp_path, procs):
    path = tmp_path / "run-x.lock"
    holder = _spawn_holder(path, tmp_path)
    procs.append(holder)
    with pytest.raises(LockHeld) as info:
        FileLock(path).acquire()
    owner = info.value.owner
    assert owner is not None and owner.pid == holder.pid and owner.host == socket.gethostname()
    assert owner.what == "holder job"
    assert str(holder.pid) in str(info.value) and socket.gethostname() in str(info.value)
    # Waiting a while does not help while the holder lives (its heartbeat keeps it fresh).
    t0 = time.monotonic()
    with pytest.raises(LockHeld):
        FileLock(path, wait_s=1.5, heartbeat_s=0.2, stale_after_s=1.0).acquire()
    assert time.monotonic() - t0 >= 1.4
    assert path.exists()


def test_dead_holder_is_detected_at_once_on_the_same_host(tmp_path, procs):
    path = tmp_path / "run-x.lock"
    holder = _spawn_holder(path, tmp_path)
    procs.append(holder)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    assert path.exists(), "a killed holder cannot clean up"
    t0 = time.monotonic()
    lock = FileLock(path, what="second", stale_after_s=3600)  # no heartbeat wait: pid check decides
    with lock:
        assert time.monotonic() - t0 < 1.0
        assert [o.pid for o in lock.broken] == [holder.pid]
        assert [t.reason for t in lock.takeovers] == [f"its process (pid {holder.pid}) is gone"]
        assert json.loads(path.read_text())["what"] == "second"
    assert not path.exists()


def test_holder_released_normally_lets_the_next_in(tmp_path, procs):
    path = tmp_path / "run-x.lock"
    holder = _spawn_holder(path, tmp_path, hold=0.5)
    procs.append(holder)
    lock = FileLock(path, wait_s=20)
    lock.acquire()
    try:
        assert holder.wait(timeout=10) == 0
        assert lock.broken == []
    finally:
        lock.release()


def _write_record(path: Path, owner: Owner, age_s: float) -> None:
    path.write_text(owner.to_json())
    t = time.time() - age_s
    os.utime(path, (t, t))


def test_remote_holder_judged_by_heartbeat(tmp_path):
    path = tmp_path / "host-data@other.lock"
    remote = Owner(host="some-other-host", pid=1, started=time.time() - 100, what="job on other",
                   pidns="pid:[1]", proc_start="1", token="abc")
    _write_record(path, remote, age_s=1.0)  # fresh heartbeat: alive, whatever its pid
    with pytest.raises(LockHeld) as info:
        FileLock(path, heartbeat_s=1, stale_after_s=5).acquire()
    assert "some-other-host" in str(info.value) and info.value.owner.token == "abc"
    _write_record(path, remote, age_s=10.0)  # silent for longer than stale_after_s: dead
    with FileLock(path, heartbeat_s=1, stale_after_s=5) as lock:
        assert [o.token for o in lock.broken] == ["abc"]


def test_reused_pid_is_not_a_living_holder(tmp_path):
    path = tmp_path / "run-x.lock"
    me = owners.this_owner("old me")
    _write_record(path, Owner(**{**me.__dict__, "proc_start": "1", "token": "old"}), age_s=0)
    with FileLock(path, stale_after_s=3600) as lock:
        assert [o.token for o in lock.broken] == ["old"]


def test_heartbeat_keeps_the_lock_fresh_and_release_spares_foreign_locks(tmp_path):
    path = tmp_path / "run-x.lock"
    lock = FileLock(path, heartbeat_s=0.1, stale_after_s=0.5)
    lock.acquire()
    old = time.time() - 100
    os.utime(path, (old, old))
    time.sleep(0.4)
    assert time.time() - path.stat().st_mtime < 0.5
    # Someone broke our lock and took it: the heartbeat notices, release leaves theirs alone.
    foreign = Owner(host="elsewhere", pid=7, started=time.time(), token="theirs")
    path.write_text(foreign.to_json())
    time.sleep(0.4)
    assert lock.lost
    lock.release()
    assert json.loads(path.read_text())["token"] == "theirs"


RACER = textwrap.dedent("""
    import os, sys, time
    from appliance.mount.locks import FileLock, LockHeld
    path, go, out = sys.argv[1], sys.argv[2], sys.argv[3]
    while not os.path.exists(go):
        time.sleep(0.001)
    try:
        with FileLock(path, heartbeat_s=0.5, stale_after_s=30):
            open(out, "w").write("won")
            time.sleep(1.0)
    except LockHeld:
        open(out, "w").write("lost")
""")


def test_exactly_one_of_many_concurrent_contenders_wins(tmp_path, procs):
    path, go = tmp_path / "contended.lock", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    outs = [tmp_path / f"out.{i}" for i in range(6)]
    for out in outs:
        procs.append(subprocess.Popen([sys.executable, "-c", RACER, str(path), str(go), str(out)], env=env))
    time.sleep(1.0)  # let them all import and spin
    go.touch()
    for p in procs:
        assert p.wait(timeout=30) == 0
    results = sorted(o.read_text() for o in outs)
    assert results == ["lost"] * 5 + ["won"]
    assert not path.exists()


def test_run_lock_says_which_dead_holder_it_took_over(tmp_path, procs):
    layout = Layout(tmp_path).ensure()
    holder = _spawn_holder(Path(layout.run_lock_path("digits")), tmp_path)
    procs.append(holder)
    holder.kill()
    holder.wait(timeout=10)
    said: list[str] = []
    with run_lock(layout, "digits", what="job B", say=said.append):
        assert json.loads(Path(layout.run_lock_path("digits")).read_text())["what"] == "job B"
    assert len(said) == 1, said
    assert "run 'digits'" in said[0] and "holder job" in said[0] and f"pid {holder.pid}" in said[0]
    assert "is dead (its process" in said[0]


def test_same_pid_namespace_id_on_another_kernel_is_not_judged_by_pid(tmp_path):
    # A record from another boot (or another machine whose initial pid namespace has the same
    # id, as every machine's does): its pid means nothing here, so only the heartbeat counts.
    path = tmp_path / "run-x.lock"
    me = owners.this_owner("elsewhere")
    gone = Owner(**{**me.__dict__, "pid": 2 ** 22 + 17, "boot_id": "another-boot", "token": "other"})
    _write_record(path, gone, age_s=0)
    with pytest.raises(LockHeld):
        FileLock(path, stale_after_s=3600).acquire()
    # ...while on this kernel, even under another host name (a container sharing the pid
    # namespace), the dead pid decides at once.
    same = Owner(**{**gone.__dict__, "boot_id": owners.boot_id(), "host": "another-name", "token": "same"})
    _write_record(path, same, age_s=0)
    with FileLock(path, stale_after_s=3600) as lock:
        assert [o.token for o in lock.broken] == ["same"]


def test_run_lock_names_the_run_and_creates_its_dir(tmp_path):
    layout = Layout(tmp_path).ensure()
    with run_lock(layout, "digits", what="job A"):
        assert os.path.isdir(layout.run_dir("digits"))
        with pytest.raises(LockHeld) as info:
            with run_lock(layout, "digits", what="job B"):
                pass
        assert "'digits'" in str(info.value) and "job A" in str(info.value)
        with run_lock(layout, "other"):  # another run is independent
            pass
    with run_lock(layout, "digits"):
        pass
    for bad in ("", "../x", ".hidden", "a/b", "-x"):
        with pytest.raises(ValueError):
            layout.run_dir(bad)


def test_host_locks_carry_the_host_name(tmp_path):
    layout = Layout(tmp_path).ensure()
    a = host_lock(layout, "prepare", host="node1")
    b = host_lock(layout, "prepare", host="node2")
    assert a.path.endswith("host-prepare@node1.lock") and b.path.endswith("host-prepare@node2.lock")
    with a, b:  # different hosts: no contention
        with pytest.raises(LockHeld):
            host_lock(layout, "prepare", host="node1").acquire()
        assert json.loads(Path(a.path).read_text())["host"] == socket.gethostname()


def test_save_atomically_never_shows_a_torn_file(tmp_path):
    target = tmp_path / "checkpoint.bin"
    save_atomically(lambda f: f.write(b"A" * 100), str(target))

    def failing(f):
        f.write(b"B" * 50)
        raise RuntimeError("crash mid-write")
    with pytest.raises(RuntimeError):
        save_atomically(failing, str(target))
    assert target.read_bytes() == b"A" * 100
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.bin"]  # no temporary left behind


def test_the_training_job_and_the_mount_package_need_no_cluster_plane(tmp_path):
    """Data flows down: ``appliance.mount`` and the default job (with its run lock) run without
    importing the Docker plane, the launcher or the docker SDK."""
    code = textwrap.dedent("""
        import json, sys
        import appliance.mount
        assert not [m for m in sys.modules if m.startswith(("appliance.cluster", "appliance.launcher", "docker"))]
        from appliance.examples import train
        assert train.main(["--epochs", "1", "--shared", sys.argv[1], "--run", "r", "--device", "cpu"]) == 0
        print(json.dumps(sorted(m for m in sys.modules
                                if m.startswith(("appliance.cluster", "appliance.launcher", "docker")))))
    """)
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.splitlines()[-1]) == []
    assert (tmp_path / "models" / "r" / "checkpoint.pt").exists()


JOB_HOLDER = textwrap.dedent("""
    import sys, time
    from appliance.mount import Layout, RunLock
    shared, job, ready = sys.argv[1], sys.argv[2], sys.argv[3]
    lock = RunLock(Layout(shared), "r", job, what="rank 0 of " + job, heartbeat_s=0.2, stale_after_s=30.0)
    lock.follow(True)
    open(ready, "w").close()
    while not lock.lock.lost:
        time.sleep(0.05)
    print("lost", flush=True)
    lock.close()
""")


def test_the_run_lock_of_a_job_passes_to_another_process_of_that_job_at_once(tmp_path):
    """RunLock: the job owns the run. A living holder of job J hands the lock over to another
    process of J at once (a new rank 0), which notices nothing wrong; the old holder sees it lost
    and its release leaves the new holder's file alone. Another job still finds it held."""
    from appliance.mount import RunLock

    layout = Layout(str(tmp_path)).ensure()
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    old = subprocess.Popen([sys.executable, "-c", JOB_HOLDER, str(tmp_path), "job-a", str(ready)], env=env,
                           stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert old.poll() is None and time.monotonic() < deadline, "the first holder did not take the lock"
            time.sleep(0.05)
        with pytest.raises(LockHeld, match="rank 0 of job-a"):
            RunLock(layout, "r", "job-b", stale_after_s=30.0).follow(True)
        said: list[str] = []
        t0 = time.monotonic()
        new = RunLock(layout, "r", "job-a", what="new rank 0", say=said.append, stale_after_s=30.0)
        assert new.follow(True) is True and new.held
        assert time.monotonic() - t0 < 2.0
        assert said and "took over" in said[0] and "job-a" in said[0]
        assert new.follow(True) is False  # already held: nothing to do
        out, _ = old.communicate(timeout=20)  # its heartbeat finds the file someone else's
        assert "lost" in out and old.returncode == 0
        assert Owner.from_json(Path(layout.run_lock_path("r")).read_text()).what == "new rank 0"
        new.follow(False)  # no longer the writer: lets it go
        assert not os.path.exists(layout.run_lock_path("r"))
        new.close()
    finally:
        if old.poll() is None:
            old.kill()
            old.wait()
