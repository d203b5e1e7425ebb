"""Taking over the lock of a holder in another pid namespace (a container), and the lock sweep.

Holders are real processes in a pid namespace of their own (``unshare --pid --fork
--mount-proc``), the way a rank runs inside a container: pid 1 of that namespace carries
``APPLIANCE_CONTAINER``, as Docker's init does for containers the appliance starts. Contenders
in this namespace cannot see such a holder's process, so without more facts its lock is judged
by its heartbeat; the sweep (``appliance primary``'s, with Docker as the judge; here a fake
engine answers for the container) takes it over at once once the container is gone.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from appliance.mount import FileLock, LockHeld, container_gone_reason, sweep
from appliance.mount.owner import container_identity, read_owner, split_container
from fixtures import ROOT

ENGINE = "ENGINE:TEST:0001"

HOLDER = textwrap.dedent("""
    import sys, time
    from appliance.mount import FileLock
    path, ready = sys.argv[1], sys.argv[2]
    with FileLock(path, what="job in a container", heartbeat_s=0.2, stale_after_s=2.0):
        open(ready, "w").close()
        time.sleep(120)
""")


def _can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], timeout=10,
                              capture_output=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_pidns = pytest.mark.skipif(not _can_unshare(), reason="unshare --pid --mount-proc not permitted here (needs root)")


class Holder:
    """A lock holder as pid 1 of a new pid namespace (``own_env``: set the variable on the
    holder only, behind a shell that is pid 1, instead of on pid 1)."""

    def __init__(self, path: Path, tmp: Path, container: str, own_env: bool = False):
        ready = tmp / f"ready.{time.monotonic_ns()}"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT)}
        py = [sys.executable, "-c", HOLDER, str(path), str(ready)]
        if own_env:
            inner = ["sh", "-c", 'APPLIANCE_CONTAINER="$0" "$@"; exit $?', container, *py]
        else:
            inner = ["env", f"APPLIANCE_CONTAINER={container}", *py]
        self.outer = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", *inner], env=env,
                                      start_new_session=True)
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert self.outer.poll() is None, f"holder exited early ({self.outer.returncode})"
            assert time.monotonic() < deadline, "holder did not take the lock within 30 s"
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the whole namespace (what ``docker kill`` does to a container)."""
        if self.outer.poll() is None:
            os.killpg(self.outer.pid, signal.SIGKILL)
        self.outer.wait(timeout=10)


@pytest.fixture
def holders():
    started: list[Holder] = []
    yield started
    for h in started:
        h.kill()


def _gone(name: str):
    return None


@needs_pidns
def test_holder_in_a_container_records_its_container_and_is_not_judged_by_our_pids(tmp_path, holders):
    path = tmp_path / "run-digits.lock"
    container = f"appliance-primary-x@{ENGINE}"
    h = Holder(path, tmp_path, container)
    holders.append(h)
    owner, _ = read_owner(str(path))
    assert owner.container == container and owner.pid == 1 and owner.pidns != os.readlink("/proc/self/ns/pid")
    with pytest.raises(LockHeld):
        FileLock(path).acquire()
    h.kill()
    # Its pid 1 is not our pid 1: still not provably dead from here, whatever our /proc says.
    with pytest.raises(LockHeld):
        FileLock(path, stale_after_s=3600).acquire()
    assert json.loads(path.read_text())["token"] == owner.token


@needs_pidns
def test_sweep_takes_over_at_once_when_the_container_is_gone(tmp_path, holders):
    path = tmp_path / "run-digits.lock"
    container = f"appliance-primary-x@{ENGINE}"
    h = Holder(path, tmp_path, container)
    holders.append(h)
    owner, _ = read_owner(str(path))
    asked: list[str] = []

    def running_since_before(name: str):
        asked.append(name)
        return ("running", owner.started - 5)

    # Its container lives: nothing is taken over (the holder heartbeats, too).
    assert sweep(str(tmp_path), lambda o: container_gone_reason(o, ENGINE, running_since_before)) == []
    assert asked == ["appliance-primary-x"] and path.exists()
    h.kill()
    # Another engine's container: not ours to judge.
    assert sweep(str(tmp_path), lambda o: container_gone_reason(o, "OTHER:ENGINE", _gone)) == []
    assert path.exists()
    t0 = time.monotonic()
    done = sweep(str(tmp_path), lambda o: container_gone_reason(o, ENGINE, _gone))
    assert [t.owner.token for t in done] == [owner.token] and not path.exists()
    line = done[0].describe()
    assert "job in a container" in line and "appliance-primary-x is gone" in line
    with FileLock(path, stale_after_s=3600) as lock:  # the next job takes it without waiting
        assert lock.broken == []
    assert time.monotonic() - t0 < 2.0


@needs_pidns
def test_container_name_is_read_from_the_containers_init_not_the_holders_env(tmp_path, holders):
    path = tmp_path / "run-digits.lock"
    h = Holder(path, tmp_path, f"appliance-other@{ENGINE}", own_env=True)
    holders.append(h)
    owner, _ = read_owner(str(path))
    assert owner.container == ""  # pid 1 (a shell) has no APPLIANCE_CONTAINER
    h.kill()
    assert sweep(str(tmp_path), lambda o: container_gone_reason(o, ENGINE, _gone)) == []
    assert path.exists()


def test_container_verdicts(tmp_path):
    from appliance.mount import Owner

    o = Owner(host="h", pid=1, started=1000.0, container=f"appliance-primary-x@{ENGINE}", token="t")
    assert container_gone_reason(o, ENGINE, lambda n: ("running", 999.0)) is None
    assert container_gone_reason(o, ENGINE, lambda n: ("paused", 999.0)) is None
    assert "is exited" in container_gone_reason(o, ENGINE, lambda n: ("exited", 999.0))
    assert "started again" in container_gone_reason(o, ENGINE, lambda n: ("running", 1001.0))
    assert "is gone" in container_gone_reason(o, ENGINE, _gone)
    assert container_gone_reason(o, "", _gone) is None
    bare = Owner(host="h", pid=1, started=1000.0, token="t")
    assert container_gone_reason(bare, ENGINE, _gone) is None and container_gone_reason(None, ENGINE, _gone) is None
    assert split_container("a-b.c@X:Y") == ("a-b.c", "X:Y") and split_container("nodelim") == ("", "")
    # Identity from a proc tree's pid 1.
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "environ").write_bytes(b"PATH=/bin\0APPLIANCE_CONTAINER=appliance-n2@E:1\0X=1\0")
    assert container_identity(str(tmp_path)) == "appliance-n2@E:1"
    (tmp_path / "1" / "environ").write_bytes(b"APPLIANCE_CONTAINER=garbage\0")
    assert container_identity(str(tmp_path)) == ""


class _FakeEngine:
    """Stands in for the docker SDK client in the sweep: the engine id and containers by name."""

    def __init__(self, containers: dict):
        self.known = containers
        self.containers = self

    def info(self) -> dict:
        return {"ID": ENGINE}

    def get(self, name: str):
        import docker

        if name not in self.known:
            raise docker.errors.NotFound(f"no such container: {name}")
        return self.known[name]


class _FakeContainer:
    def __init__(self, status: str, started_at: str):
        self.status = status
        self.attrs = {"State": {"Status": status, "StartedAt": started_at}}


@needs_pidns
def test_primarys_sweep_asks_the_engine_and_says_what_it_took_over(tmp_path, holders):
    pytest.importorskip("docker")
    from appliance.cluster.locksweep import sweep_dead_container_locks
    from appliance.mount import Layout

    layout = Layout(tmp_path).ensure()
    dead = Holder(Path(layout.run_lock_path("dead")), tmp_path, f"appliance-primary-dead@{ENGINE}")
    live = Holder(Path(layout.run_lock_path("live")), tmp_path, f"appliance-primary-live@{ENGINE}")
    holders.extend([dead, live])
    dead.kill()
    engine = _FakeEngine({"appliance-primary-live": _FakeContainer("running", "2000-01-01T00:00:00.123456789Z")})
    said: list[str] = []
    done = sweep_dead_container_locks(engine, layout, said.append)
    assert [os.path.basename(t.path) for t in done] == ["run-dead.lock"]
    assert not os.path.exists(layout.run_lock_path("dead")) and os.path.exists(layout.run_lock_path("live"))
    assert len(said) == 1 and "appliance-primary-dead is gone" in said[0]
    # The live one restarted after its lock was taken: its holder died with the old start.
    engine.known["appliance-primary-live"] = _FakeContainer("running", "2999-01-01T00:00:00Z")
    assert [os.path.basename(t.path) for t in sweep_dead_container_locks(engine, layout, said.append)] == \
        ["run-live.lock"]
