"""The Python spawn helper ``appliance.launcher.launch`` with real worker processes."""
import re
import time

import pytest

from appliance.launcher import HostsError, LaunchError, launch

DUMP_ENV = 'mark("env", json.dumps(dict(os.environ)))\n'


@pytest.mark.timeout(60)
def test_env_contract_seen_by_each_rank(job, monkeypatch, tmp_path):
    monkeypatch.setenv("APPL_TEST_INHERITED", "from-launcher")
    monkeypatch.setenv("APPL_TEST_FWD", "forwarded")
    monkeypatch.setenv("HOROVOD_RANK", "77")  # a stale value in the launcher's env must not leak
    r = launch(job.argv(DUMP_ENV + 'print("rank", RANK, "done")'), np=3, hosts="localhost:2,127.0.0.1:2",
               env={"APPL_TEST_EXTRA": "x=1"}, forward=["APPL_TEST_FWD", "APPL_TEST_SET=v"], timeout=30)
    assert r.returncode == 0, r
    assert r.failed_rank is None and not r.timed_out
    envs = {rank: job.env(rank) for rank in range(3)}
    # localhost and 127.0.0.1 are one machine: one host with 4 slots, named as first given
    layout = {0: ("localhost", 0, 3, 0, 1), 1: ("localhost", 1, 3, 0, 1), 2: ("localhost", 2, 3, 0, 1)}
    secret, job_id, store = envs[0]["APPLIANCE_JOB_SECRET"], envs[0]["APPLIANCE_JOB_ID"], envs[0]["APPLIANCE_STORE_ADDR"]
    assert re.fullmatch(r"[0-9a-f]{32}", secret) and re.fullmatch(r"[0-9a-f]{8}", job_id) and job_id == r.job_id
    host, _, port = store.rpartition(":")
    assert host == "127.0.0.1" and 0 < int(port) < 65536
    for rank, e in envs.items():
        hostname, local_rank, local_size, cross_rank, cross_size = layout[rank]
        assert e["HOROVOD_RANK"] == e["RANK"] == str(rank)
        assert e["HOROVOD_SIZE"] == e["WORLD_SIZE"] == "3"
        assert e["HOROVOD_LOCAL_RANK"] == e["LOCAL_RANK"] == str(local_rank)
        assert e["HOROVOD_LOCAL_SIZE"] == e["LOCAL_WORLD_SIZE"] == str(local_size)
        assert (e["HOROVOD_CROSS_RANK"], e["HOROVOD_CROSS_SIZE"]) == (str(cross_rank), str(cross_size))
        assert e["HOROVOD_HOSTNAME"] == hostname
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] != port and 0 < int(e["MASTER_PORT"]) < 65536
        assert e["APPLIANCE_STORE_ADDR"] == store and e["APPLIANCE_JOB_SECRET"] == secret
        assert e["APPLIANCE_JOB_ID"] == job_id and e["APPLIANCE_DATA_ADDR"] == "127.0.0.1"
        assert e["PYTHONUNBUFFERED"] == "1" and float(e["HOROVOD_START_TIMEOUT"]) > 0
        assert e["APPL_TEST_INHERITED"] == "from-launcher" and e["APPL_TEST_EXTRA"] == "x=1"
        assert e["APPL_TEST_FWD"] == "forwarded" and e["APPL_TEST_SET"] == "v"
    assert sorted((rk, t) for rk, s, t in r.lines) == [(0, "rank 0 done"), (1, "rank 1 done"), (2, "rank 2 done")]
    assert r.output(1) == "rank 1 done\n"
    assert secret not in repr(r)
    # a second job gets a fresh secret and id
    r2 = launch(job.argv(DUMP_ENV), np=1, timeout=30)
    assert r2.returncode == 0 and job.env(0)["APPLIANCE_JOB_SECRET"] != secret and r2.job_id != job_id


@pytest.mark.timeout(60)
def test_failing_rank_stops_others_even_those_ignoring_sigterm(job):
    body = '''
if RANK == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # must be escalated to SIGKILL
    mark("ignoring")
if RANK == 2:
    child = grandchild()                           # must die with its rank's process group
if RANK == 1:
    wait_for("pid.0", "pid.2", "grandchild.2", "ignoring.0")
    print("rank 1 fails now", flush=True)
    sys.exit(7)
time.sleep(60)
'''
    start = time.monotonic()
    r = launch(job.argv(body), np=3, timeout=40, env={"APPLIANCE_STOP_GRACE": "1", "APPLIANCE_FAILURE_GRACE": "0.5"})
    elapsed = time.monotonic() - start
    assert (r.returncode, r.failed_rank, r.failed_host) == (7, 1, "localhost"), r
    assert "rank 1" in r.reason and "code 7" in r.reason and "localhost" in r.reason
    assert not r.timed_out and elapsed < 15, elapsed
    pids = job.pids()
    assert len(pids) == 4
    assert job.wait_dead(pids, 1.0) == []
    assert (1, "stdout", "rank 1 fails now") in r.lines


@pytest.mark.timeout(60)
def test_rank_killed_by_signal_is_reported_with_128_plus_signal(job):
    body = '''
if RANK == 1:
    wait_for("pid.0")
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
'''
    start = time.monotonic()
    r = launch(job.argv(body), np=2, timeout=40)
    assert (r.returncode, r.failed_rank, r.failed_host) == (137, 1, "localhost"), r
    assert "SIGKILL" in r.reason and time.monotonic() - start < 15
    assert job.wait_dead(job.pids(), 1.0) == []


@pytest.mark.timeout(60)
def test_timeout_stops_everything_and_says_so(job):
    body = '''
if RANK == 0:
    grandchild()
time.sleep(60)
'''
    start = time.monotonic()
    r = launch(job.argv(body), np=2, timeout=2.0)
    elapsed = time.monotonic() - start
    assert r.timed_out and r.returncode == 124 and r.failed_rank is None, r
    assert "timed out after 2 s" in r.reason
    assert 2.0 <= elapsed < 10, elapsed
    pids = job.pids()
    assert len(pids) == 3 and job.wait_dead(pids, 1.0) == []


@pytest.mark.timeout(60)
def test_output_files_capture_and_unstarted_command(job, tmp_path):
    out = tmp_path / "logs"
    r = launch(job.argv('print("o%d" % RANK); print("e%d" % RANK, file=sys.stderr)'), np=2, output=out, timeout=30)
    assert r.returncode == 0
    for rank in range(2):
        assert (out / f"rank.{rank}" / "stdout").read_text() == f"o{rank}\n"
        assert (out / f"rank.{rank}" / "stderr").read_text() == f"e{rank}\n"
        assert r.output(rank, "stderr") == f"e{rank}\n"
    r = launch([str(tmp_path / "no-such-program")], np=2, timeout=30)
    assert r.returncode == 127 and r.failed_rank == 0 and "no-such-program" in r.reason, r


def test_bad_arguments_raise_before_anything_starts(job):
    with pytest.raises(HostsError, match="2 slots"):
        launch(job.argv(""), np=3, hosts="localhost:2")
    with pytest.raises(ValueError, match="APPLIANCE_JOB_SECRET"):
        launch(job.argv(""), np=1, env={"APPLIANCE_JOB_SECRET": "00"})
    with pytest.raises(LaunchError, match="192.0.2.1"):
        launch(job.argv(""), np=2, hosts="localhost:1,192.0.2.1:1")
    assert job.files("pid") == {}


@pytest.mark.timeout(60)
def test_bind_core_gives_each_local_rank_its_share_of_the_cpus(job, monkeypatch):
    import json
    import os

    from appliance.launcher.binding import rank_cpus

    monkeypatch.setenv("APPLIANCE_BIND", "core")
    r = launch(job.argv('mark("cpus", json.dumps(sorted(os.sched_getaffinity(0))))'), np=3, hosts="localhost:3",
               timeout=30)
    assert r.returncode == 0, r
    allowed = os.sched_getaffinity(0)
    assert {k: json.loads(job.read("cpus", k)) for k in range(3)} == {k: rank_cpus(k, 3, allowed) for k in range(3)}
