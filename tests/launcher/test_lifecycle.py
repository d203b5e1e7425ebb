"""The launcher's lifecycle faults (a rank's failure, a killed launcher, a signal, and the culprit): real launchers, real ranks.

- a killed launcher takes its local ranks (whole process groups) with it within 2 s;
- one machine named twice is one host;
- after the first failure the survivors get APPLIANCE_FAILURE_GRACE to finish their handlers;
- the summary blames the rank a fault report names, not the healthy rank that reported it.
"""
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from appliance.launcher import launch
from fixtures import RANKS, ROOT

GRACE_WORKER = str(RANKS / "failure_grace.py")
DUMP_ENV = 'mark("env", json.dumps(dict(os.environ)))\n'


def finish(p, limit=20):
    out, err = p.communicate(timeout=limit)
    return p.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def reapers_of(launcher_pid: int) -> list[int]:
    """Live reaper processes started by the launcher ``launcher_pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"launcher/reaper.py") for a in argv) and str(launcher_pid).encode() in argv:
            found.append(int(entry))
    return found


# --- fault 1: a killed launcher -------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("ignore_term", [False, True])
def test_killed_launcher_takes_its_local_ranks_and_grandchildren_within_2s(job, ignore_term):
    body = DUMP_ENV + ('signal.signal(signal.SIGTERM, signal.SIG_IGN)\n' if ignore_term else '') + '''
grandchild()
time.sleep(60)
'''
    p = job.cli("-np", "2", *job.argv(body))
    job.wait_files("pid", 2)
    job.wait_files("grandchild", 2)
    pids = job.pids()
    assert len(pids) == 4
    fault_dir = os.path.dirname(job.env(0).get("APPLIANCE_FAULT_FILE", ""))
    reapers = reapers_of(p.pid)
    start = time.monotonic()
    os.kill(p.pid, signal.SIGKILL)  # the launcher only: nothing else gets a signal from the test
    left = job.wait_dead(pids, 2.0)
    elapsed = time.monotonic() - start
    assert left == [], f"still alive {elapsed:.2f} s after the launcher was killed: {left}"
    assert len(reapers) == 1 and job.wait_dead(reapers, 1.0) == []
    assert fault_dir and not os.path.exists(fault_dir)  # the launcher-private directory goes too
    print(f"\nlocal ranks gone {elapsed:.2f} s after kill -9 of the launcher (ranks ignore SIGTERM: {ignore_term})")


@pytest.mark.timeout(60)
def test_reaper_signals_nothing_after_a_normal_end(job):
    r = launch(job.argv('print("ok")'), np=2, timeout=30)
    assert r.returncode == 0, r
    assert job.wait_dead(reapers_of(os.getpid()), 2.0) == []
    assert job.files("pid") and all(not job.alive(int(pid)) for pid in job.files("pid").values())


# --- fault 2: one machine named twice --------------------------------------------------------------
@pytest.mark.timeout(60)
def test_names_of_this_machine_are_one_host(job, capfd):
    me = socket.gethostname()
    r = launch(job.argv(DUMP_ENV), np=4, hosts=f"localhost:1,127.0.0.1:2,{me}:1", timeout=30)
    assert r.returncode == 0, r
    envs = [job.env(rank) for rank in range(4)]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["HOROVOD_LOCAL_RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["HOROVOD_LOCAL_SIZE"] for e in envs} == {e["LOCAL_WORLD_SIZE"] for e in envs} == {"4"}
    assert {(e["HOROVOD_CROSS_RANK"], e["HOROVOD_CROSS_SIZE"]) for e in envs} == {("0", "1")}
    assert {e["HOROVOD_HOSTNAME"] for e in envs} == {"localhost"}
    err = capfd.readouterr().err
    assert err.count("name this machine") == 1, err


@pytest.mark.timeout(60)
def test_ssh_flags_for_a_job_on_this_machine_alone_are_said_unused_once(job):
    p = job.cli("-np", "2", "-H", "localhost:1,127.0.0.1:1", "-p", "2222", "-i", "/nonexistent/key",
                *job.argv(DUMP_ENV))
    rc, out, err = finish(p)
    assert rc == 0, err
    assert [job.env(r)["LOCAL_RANK"] for r in (0, 1)] == ["0", "1"]
    assert err.count("unused") == 1 and "-p and -i" in err, err


# --- fault 3: the survivors' grace ----------------------------------------------------------------
def _grace_job(tmp_path, mode, env, timeout=60):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    start = time.monotonic()
    r = launch([sys.executable, GRACE_WORKER, str(out), mode], np=2, timeout=timeout,
               env={"PYTHONPATH": str(ROOT), **env})
    return r, out, time.monotonic() - start


@pytest.mark.timeout(90)
def test_survivor_finishes_its_error_handler_before_being_stopped(tmp_path):
    r, out, _ = _grace_job(tmp_path, "exit", {"APPLIANCE_TEST_HANDLER": "1"})
    assert (out / "handled.0").exists(), r  # slept 1 s in its handler, then wrote: not SIGTERMed at once
    assert "rank 1" in (out / "handled.0").read_text()
    assert (r.returncode, r.failed_rank, r.failed_host) == (3, 1, "localhost"), r
    assert "stopped" not in r.reason, r.reason  # rank 0 ended by itself


@pytest.mark.timeout(90)
def test_grace_ends_as_soon_as_the_survivors_have_exited(tmp_path):
    r, out, _ = _grace_job(tmp_path, "exit", {"APPLIANCE_FAILURE_GRACE": "30"})
    died_at = float((out / "died_at").read_text())
    after = time.time() - died_at
    assert r.returncode == 3 and r.failed_rank == 1, r  # rank 0's own exit 1 does not change the blame
    assert after < 10, after  # far below the 30 s grace: rank 0 raised and exited by itself


@pytest.mark.timeout(60)
def test_ranks_exiting_in_the_grace_keep_the_blame_and_stragglers_are_stopped_after_it(job):
    body = '''
if RANK == 1:
    wait_for("pid.0", "pid.2")
    sys.exit(3)
signal.signal(signal.SIGTERM, lambda *a: (mark("termed"), sys.exit(143)))
wait_for("pid.1")
while os.path.exists("/proc/%s" % job_pid(1)):
    time.sleep(0.01)
if RANK == 0:
    time.sleep(0.3)
    mark("handled")
    sys.exit(5)
time.sleep(60)   # rank 2 never ends by itself: SIGTERM after the grace
'''
    body = 'def job_pid(r):\n    return open(os.path.join(OUT, "pid.%d" % r)).read()\n' + body
    start = time.monotonic()
    r = launch(job.argv(body), np=3, timeout=40, env={"APPLIANCE_FAILURE_GRACE": "1.5", "APPLIANCE_STOP_GRACE": "1"})
    elapsed = time.monotonic() - start
    assert (r.returncode, r.failed_rank) == (3, 1), r
    assert set(job.files("handled")) == {0} and set(job.files("termed")) == {2}
    assert 1.5 <= elapsed < 10, elapsed
    assert "stopped 1 other rank" in r.reason, r.reason
    assert job.wait_dead(job.pids(), 1.0) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["SIGTERM", "timeout"])
def test_signal_or_timeout_in_the_grace_stop_at_once(job, how):
    body = '''
if RANK == 1:
    wait_for("pid.0")
    sys.exit(3)
time.sleep(60)
'''
    env = {"APPLIANCE_FAILURE_GRACE": "30", "APPLIANCE_STOP_GRACE": "1"}
    if how == "timeout":
        start = time.monotonic()
        r = launch(job.argv(body), np=2, timeout=3, env=env)
        elapsed = time.monotonic() - start
        assert (r.returncode, r.failed_rank) == (3, 1) and elapsed < 8, (r, elapsed)
    else:
        p = job.cli("-np", "2", *job.argv(body), env=env)
        job.wait_files("pid", 2)
        while p.poll() is None and job.alive(int(job.read("pid", 1))):
            time.sleep(0.02)
        time.sleep(0.3)  # inside the grace now
        start = time.monotonic()
        os.kill(p.pid, signal.SIGTERM)
        rc, _, err = finish(p)
        assert rc == 3 and time.monotonic() - start < 5, (rc, err)
        assert "grace was cut short by SIGTERM" in err
    assert job.wait_dead(job.pids(), 1.0) == []


# --- the culprit in the summary --------------------------------------------------------------------
REPORT = '''
def report_fault(origin, kind, message):
    path = os.environ["APPLIANCE_FAULT_FILE"]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"rank": RANK, "host": os.environ["HOROVOD_HOSTNAME"], "origin_rank": origin,
                   "origin_host": "", "kind": kind, "message": message, "time": time.time()}, f)
    os.replace(tmp, path)
'''


@pytest.mark.timeout(60)
def test_summary_blames_the_silent_rank_a_report_names_not_the_reporter(job):
    """Rank 1 is stopped (SIGSTOP: silent, never fails by itself); rank 0 reports it lost and exits 1."""
    body = DUMP_ENV + REPORT + '''
if RANK == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
if RANK == 0:
    wait_for("pid.1")
    time.sleep(0.2)
    report_fault(1, "peer_lost", "peer lost: rank 1 (localhost): no heartbeat for 1 s")
    sys.exit(1)
time.sleep(60)
'''
    r = launch(job.argv(body), np=3, hosts="localhost:3", timeout=40,
               env={"APPLIANCE_FAILURE_GRACE": "0.5", "APPLIANCE_STOP_GRACE": "0.5"})
    assert (r.returncode, r.failed_rank, r.failed_host) == (1, 1, "localhost"), r
    assert r.reason.startswith("rank 1 (host localhost) was lost: peer lost: rank 1"), r.reason
    assert "reported by rank 0" in r.reason
    files = [job.env(rank)["APPLIANCE_FAULT_FILE"] for rank in range(3)]
    assert len(set(files)) == 3 and len({os.path.dirname(f) for f in files}) == 1
    assert not os.path.exists(os.path.dirname(files[0]))  # the launcher-private directory is cleaned
    assert job.wait_dead(job.pids(), 1.0) == []  # the stopped rank is killed too


@pytest.mark.timeout(60)
def test_a_stopped_rank_is_stopped_without_waiting_for_sigkill(job):
    """A SIGSTOPped rank holds SIGTERM pending; the launcher continues it so it acts on it at once."""
    body = '''
signal.signal(signal.SIGTERM, lambda *a: (mark("termed"), sys.exit(143)))
if RANK == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
if RANK == 0:
    wait_for("pid.1")
    time.sleep(0.2)
    sys.exit(1)
time.sleep(60)
'''
    start = time.monotonic()
    r = launch(job.argv(body), np=2, timeout=40, env={"APPLIANCE_FAILURE_GRACE": "0", "APPLIANCE_STOP_GRACE": "20"})
    elapsed = time.monotonic() - start
    assert (r.returncode, r.failed_rank) == (1, 0), r
    assert set(job.files("termed")) == {1}  # it ran its SIGTERM handler: it was not SIGKILLed after 20 s
    assert elapsed < 10, elapsed


@pytest.mark.timeout(60)
def test_report_about_the_failed_rank_itself_or_without_origin_blames_it(job):
    body = REPORT + '''
if RANK == 1:
    report_fault(None, "error", "something broke")
    sys.exit(4)
time.sleep(60)
'''
    r = launch(job.argv(body), np=2, timeout=40, env={"APPLIANCE_FAILURE_GRACE": "0"})
    assert (r.returncode, r.failed_rank) == (4, 1) and "exited with code 4" in r.reason, r


@pytest.mark.timeout(90)
def test_real_runtime_report_blames_the_stopped_rank(tmp_path):
    """Real runtime: rank 1 SIGSTOPs itself; rank 0's heartbeat declares it lost, the core writes the
    fault report, rank 0 exits 1; the launcher blames rank 1."""
    r, out, _ = _grace_job(tmp_path, "stop", {"APPLIANCE_HEARTBEAT_TIMEOUT": "1", "APPLIANCE_FAILURE_GRACE": "1",
                                               "APPLIANCE_STOP_GRACE": "0.5"})
    assert (r.failed_rank, r.failed_host) == (1, "localhost"), r
    assert r.reason.startswith("rank 1 (host localhost) was lost") and "reported by rank 0" in r.reason, r.reason
    assert r.returncode == 1


@pytest.mark.ssh
@pytest.mark.timeout(90)
def test_two_names_of_one_remote_host_are_one_host(ssh_cluster, job):
    """``ADDR`` and the same IPv4 address written as one number (inet_aton's form) are one host."""
    from fixtures.netns import PORT

    h1, _ = ssh_cluster.hosts
    alias = str(int.from_bytes(socket.inet_aton(h1.address), "big"))
    body = DUMP_ENV + 'import socket\nmark("where", socket.gethostname())\n'
    p = job.cli("-np", "3", "-H", f"localhost:1,{h1.address}:1,{alias}:1", "-p", str(PORT), "--", *job.argv(body),
                env=ssh_cluster.env())
    rc, _, err = finish(p, 60)
    assert rc == 0, err
    envs = [job.env(r) for r in range(3)]
    assert [job.read("where", r) for r in (1, 2)] == [h1.hostname] * 2
    assert [(e["HOROVOD_HOSTNAME"], e["LOCAL_RANK"], e["HOROVOD_LOCAL_SIZE"]) for e in envs[1:]] == [
        (h1.address, "0", "2"), (h1.address, "1", "2")]
    assert [e["HOROVOD_CROSS_SIZE"] for e in envs] == ["2", "2", "1"]
    assert err.count("resolve to the same address") == 1, err
    assert ssh_cluster.wait_clean() == {}
