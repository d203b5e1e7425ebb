"""Elastic jobs on this machine, written from Horovod's documented behaviour (docs/elastic.rst):
real launcher, real driver, real worker processes and sockets; "hosts" are loopback addresses
(127.0.0.x), which an elastic job keeps apart as Horovod does (no merging of one machine's names).

Each test runs ``tests/ranks/elastic_steps.py`` (a deterministic numpy "training": ``w`` grows by
the job's size at every step, so the final ``w`` says exactly which sizes the committed steps ran
at) and asserts effects: the exit code, the state every finished worker reports, which workers
were started (survivors are never restarted), the time bounds, and that no process is left.
The same scenarios over real sshd hosts are in ``ssh/test_elastic_ssh.py``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fixtures.elastic import ElasticJob, alive, check_consistent, listening_ports

pytestmark = pytest.mark.timeout(150)

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"


def test_hosts_added_then_removed_grow_and_shrink_the_job_without_restarting_anyone(tmp_path):
    """Discovery adds a host with 2 slots (the job grows from 1 to 3 ranks at a commit), then
    removes the first host (it shrinks to 2 with no rollback; the leaving worker exits 0); the
    survivors keep their processes and every committed step is kept."""
    before = listening_ports()
    with ElasticJob(tmp_path, steps=60, commit=2, hosts=f"{A}:1") as job:
        job.start(1, max_np=4)
        job.wait_for(lambda: job.max_step() >= 1, what="a first step")
        assert listening_ports() - before, "the driver's rendezvous port"
        job.wait_for(lambda: job.max_step() >= 4, what="the first steps")
        job.set_hosts(f"{A}:1,{B}:2")
        added = time.monotonic()
        job.wait_size(3)
        grew = time.monotonic() - added
        job.set_hosts(f"{B}:2")
        job.wait_size(2, step_after=job.max_step())
        r = job.wait()
        assert r.returncode == 0, r.reason
        sizes = check_consistent({w: d for w, d in job.done().items()}, 60)
        assert sizes[0] == 1 and 3 in sizes and sizes[-1] == 2
        assert sorted(job.pids()) == [0, 1, 2]          # one process per slot, nobody restarted
        assert sorted(job.done()) == [1, 2]             # worker 0 left with its host
        assert job.done()[1]["rank"] == 0               # the oldest remaining host holds rank 0
        # the newcomers synced once, on arrival; the pure removal needed no sync, and every member
        # of that round agreed on it (a rank that skipped a sync another ran would deadlock)
        assert all(d["syncs"] == 1 and d["resets"] == 1 for d in job.done().values()), job.done()
        assert grew < 8.0, grew
        assert job.leftovers() == []
    assert listening_ports() == before  # the driver's port is closed too


@pytest.mark.parametrize("how", ["fail", "kill"])
def test_one_rank_failing_blacklists_its_host_and_the_others_go_on_from_the_last_commit(tmp_path, how):
    """Over a fixed host list (-H with --min-np): worker 1 raises (exit 1) or is SIGKILLed at step
    7 (commits every 3 steps); its host leaves the job, the other two restore step 6 and finish."""
    with ElasticJob(tmp_path, steps=20, commit=3) as job:
        job.switch(how, 1, 7)
        job.start(3, min_np=2, hosts=f"{A}:1,{B}:1,{C}:1")
        r = job.wait()
        assert r.returncode == 0, r.reason
        sizes = check_consistent(job.done(), 20)
        assert sizes == [3] * 6 + [2] * 14               # steps 1-6 committed at 3 ranks, then 2
        assert sorted(job.done()) == [0, 2] and sorted(job.pids()) == [0, 1, 2]
        assert job.leftovers() == []


def test_a_stopped_rank_is_dropped_at_the_heartbeat_timeout_and_killed(tmp_path):
    """Worker 2 SIGSTOPped (a frozen host: nothing closes, its launcher link stays up): the others'
    runtimes fail at the heartbeat timeout naming rank 2, the driver kills it (SIGKILL works on a
    stopped process) and the other two train on at 2 ranks within the heartbeat timeout + 3 s."""
    heartbeat = 2.0
    with ElasticJob(tmp_path, steps=150, commit=2, step_s=0.05) as job:
        job.start(3, min_np=2, hosts=f"{A}:1,{B}:1,{C}:1", env={"APPLIANCE_HEARTBEAT_TIMEOUT": str(heartbeat)})
        job.wait_for(lambda: job.max_step() >= 10 and len(job.progress()) == 3, what="steps at 3 ranks")
        pid = job.pids()[2]
        try:
            os.kill(pid, signal.SIGSTOP)
            stopped = time.time()
            job.wait_for(lambda: any(p["size"] == 2 for p in job.progress().values()), limit=30,
                         what="a step at 2 ranks")
            recovered = min(p["t"] for p in job.progress().values() if p["size"] == 2) - stopped
            print(f"\nstopped rank: first step at the new size {recovered:.2f} s after the SIGSTOP "
                  f"(heartbeat timeout {heartbeat:g} s)")
            assert recovered <= heartbeat + 3.0, recovered
            job.wait_for(lambda: not alive(pid), limit=10, what="the stopped worker killed")
            r = job.wait()
        finally:
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        assert r.returncode == 0, r.reason
        sizes = check_consistent(job.done(), 150)
        assert sizes[:10] == [3] * 10 and sizes[-1] == 2
        assert sorted(job.done()) == [0, 1] and job.leftovers() == []


def test_rank_0_dying_is_survived_and_the_next_oldest_worker_becomes_rank_0(tmp_path):
    """Rank 0 hosts the round's store and holds the reference state: losing it loses neither (the
    driver, not rank 0, keeps the job; the new rank 0 is the oldest surviving worker)."""
    with ElasticJob(tmp_path, steps=20, commit=3) as job:
        job.switch("kill", 0, 7)
        job.start(3, min_np=2, hosts=f"{A}:1,{B}:1,{C}:1")
        r = job.wait()
        assert r.returncode == 0, r.reason
        assert check_consistent(job.done(), 20) == [3] * 6 + [2] * 14
        assert sorted(job.done()) == [1, 2] and job.done()[1]["rank"] == 0
        assert job.leftovers() == []


def test_a_killed_rank_found_by_discovery_is_replaced_when_its_host_returns_after_the_cooldown(tmp_path):
    """--blacklist-cooldown-range 1 1: the failed host is out for about a second, then discovery
    brings it back and a new worker starts there; the job grows back to 2."""
    with ElasticJob(tmp_path, steps=80, commit=2, hosts=f"{A}:1,{B}:1") as job:
        job.switch("kill", 1, 5)
        job.start(2, min_np=1, blacklist_cooldown_range=(1, 1))
        job.wait_for(lambda: 2 in job.done() or 2 in job.pids(), limit=30, what="a worker on the returned host")
        r = job.wait()
        assert r.returncode == 0, r.reason
        sizes = check_consistent(job.done(), 80)
        assert sizes[:4] == [2] * 4 and 1 in sizes and sizes[-1] == 2
        assert sorted(job.done()) == [0, 2]
        assert job.leftovers() == []


def test_every_rank_failing_fails_the_job_naming_the_ranks(tmp_path):
    with ElasticJob(tmp_path, steps=20) as job:
        job.switch("fail", 0, 3)
        job.switch("fail", 1, 3)
        job.start(2, min_np=1, hosts=f"{A}:1,{B}:1")
        r = job.wait()
        assert r.returncode == 1 and "every rank failed" in r.reason, r.reason
        assert "rank 0" in r.reason and "rank 1" in r.reason
        assert job.done() == {} and job.leftovers() == []


@pytest.mark.parametrize("limit, ok", [(1, False), (2, True)])
def test_the_reset_limit_fails_the_job_once_used_up(tmp_path, limit, ok):
    """Two failures mean two membership changes: --reset-limit 1 fails the job at the second one,
    naming the limit; --reset-limit 2 lets it finish."""
    with ElasticJob(tmp_path, steps=24, commit=2) as job:
        job.switch("fail", 2, 4)
        job.switch("fail", 1, 10)
        job.start(3, min_np=1, hosts=f"{A}:1,{B}:1,{C}:1", reset_limit=limit)
        r = job.wait()
        if ok:
            assert r.returncode == 0, r.reason
            assert check_consistent(job.done(), 24)[-1] == 1
        else:
            assert r.returncode == 1 and "--reset-limit 1" in r.reason, r.reason
            assert job.done() == {}
        assert job.leftovers() == []


def test_fewer_than_min_np_slots_for_the_elastic_timeout_fails_the_job(tmp_path):
    with ElasticJob(tmp_path, steps=200) as job:
        job.switch("kill", 1, 3)
        job.start(2, min_np=2, hosts=f"{A}:1,{B}:1", elastic_timeout=2)
        r = job.wait()
        assert r.returncode == 1 and "fewer than --min-np 2 slots" in r.reason and "2 s" in r.reason, r.reason
        assert r.elapsed_s < 20
        assert job.leftovers() == []


def test_the_job_waits_for_np_slots_before_it_starts(tmp_path):
    """-np 2 with one host discovered: nothing starts until the second host appears."""
    with ElasticJob(tmp_path, steps=10, hosts=f"{A}:1") as job:
        job.start(2, min_np=1)
        time.sleep(1.5)
        assert job.pids() == {}
        job.set_hosts(f"{A}:1,{B}:1")
        r = job.wait()
        assert r.returncode == 0, r.reason
        assert check_consistent(job.done(), 10) == [2] * 10
        assert job.leftovers() == []


def test_a_discovery_script_broken_from_the_start_fails_the_launch(tmp_path):
    from appliance.launcher import LaunchError, launch

    bad = tmp_path / "d.sh"
    bad.write_text("#!/bin/sh\necho 'not-a-host;rm'\n")
    bad.chmod(0o755)
    with pytest.raises(LaunchError, match=r"d.sh, line 1"):
        launch(["true"], 1, host_discovery_script=str(bad), timeout=30)
    with pytest.raises(LaunchError, match="not executable"):
        bad.chmod(0o644)
        launch(["true"], 1, host_discovery_script=str(bad), timeout=30)


def test_a_transient_discovery_failure_is_retried_and_said_once(tmp_path, capfd):
    with ElasticJob(tmp_path, steps=40) as job:
        job.set_hosts(f"{A}:1")
        job.start(1)
        job.wait_for(lambda: job.max_step() >= 3, what="the first steps")
        job.script.write_text("#!/bin/sh\necho broken >&2\nexit 7\n")
        time.sleep(1.0)  # about five failed runs
        job.script.write_text(f"#!/bin/sh\ncat {job.hosts_file}\n")
        r = job.wait()
        assert r.returncode == 0, r.reason
        err = capfd.readouterr().err
        assert err.count("exited with code 7: broken") == 1 and err.count("works again") == 1, err
        assert check_consistent(job.done(), 40) == [1] * 40
        assert job.leftovers() == []


# -- Horovod's semantics where the appliance used to differ, and the bad-input cases ---------------
def _notices(job: ElasticJob) -> dict[int, list[float]]:
    return {w: json.loads(t) for w, t in job._files("notice").items()}


def test_a_new_host_is_announced_to_the_members_at_discovery_before_its_workers_start(tmp_path):
    """Horovod's elastic test program waits 3 s for the notice: it must come within a discovery
    interval (0.2 s here) of the script listing the host, before any worker starts there."""
    with ElasticJob(tmp_path, steps=50, commit=2, hosts=f"{A}:1") as job:
        job.start(1, max_np=3)
        job.wait_for(lambda: job.max_step() >= 3, what="the first steps")
        listed = time.time()
        job.set_hosts(f"{A}:1,{B}:2")
        job.wait_for(lambda: 0 in _notices(job), limit=10, what="the notice")
        told = _notices(job)[0][0] - listed
        job.wait_for(lambda: 1 in job.pids(), limit=10, what="a worker on the new host")
        started = (tmp_path / "pid.1").stat().st_mtime - listed
        print(f"\nnotice {told:.2f} s after the host was listed; its first worker's pid {started:.2f} s")
        assert told < 1.5 and told < started, (told, started)
        r = job.wait()
        assert r.returncode == 0, r.reason
        assert 3 in check_consistent(job.done(), 50)
        assert job.leftovers() == []


def test_every_rank_on_two_hosts_failing_at_once_ends_the_job_within_5_s(tmp_path):
    """All 4 ranks (2 hosts x 2) raise at the same step: the job fails at once with Horovod's
    phrase, naming every rank and its exit, and nothing is left."""
    HOROVOD_FAILED = "Horovod detected that one or more processes exited with non-zero status"
    with ElasticJob(tmp_path, steps=40, commit=1, step_s=0.1) as job:
        for w in range(4):
            job.switch("fail", w, 6)
        job.start(4, min_np=1, hosts=f"{A}:2,{B}:2", elastic_timeout=60)
        job.wait_for(lambda: len(job.progress()) == 4 and min(p["step"] for p in job.progress().values()) >= 5,
                     what="step 5 on every rank")
        failed = max(p["t"] for p in job.progress().values())
        r = job.wait(60)
        took = time.time() - failed
        print(f"\nevery rank failed: the launch returned {took:.2f} s after the last step")
        assert r.returncode != 0 and HOROVOD_FAILED in r.reason, r.reason
        for rank in range(4):  # each rank with its own exit (a host's last rank may be stopped first)
            assert f"rank {rank}, host {(A, A, B, B)[rank]}) exited with code 1" in r.reason or \
                f"rank {rank}, host {(A, A, B, B)[rank]}) was killed by signal 15" in r.reason, r.reason
        assert r.reason.count("exited with code 1") >= 2, r.reason
        assert took < 5.0, took
        assert job.done() == {} and job.leftovers() == []


def test_a_new_worker_failing_before_it_joins_does_not_stop_the_members(tmp_path, capfd):
    """One host runs every member; the worker started for its new slot exits 1 at start. The
    members train on to the end; the host takes no new worker (no cool-down: for good)."""
    with ElasticJob(tmp_path, steps=40, commit=2, hosts="localhost:2") as job:
        (tmp_path / "crash_from").write_text("2")
        job.start(2, min_np=1, max_np=4, elastic_timeout=15)
        job.wait_for(lambda: job.max_step() >= 3, what="the first steps")
        job.set_hosts("localhost:3")
        r = job.wait(90)
        assert r.returncode == 0, r.reason
        assert check_consistent(job.done(), 40) == [2] * 40 and sorted(job.done()) == [0, 1]
        assert sorted(job.pids()) == [0, 1, 2]          # one try, not respawned
        assert capfd.readouterr().err.count("before it joined a round") == 1
        assert job.leftovers() == []


def test_with_a_cooldown_a_new_worker_that_keeps_failing_is_retried_and_said_each_time(tmp_path, capfd):
    with ElasticJob(tmp_path, steps=60, commit=2, hosts="localhost:2") as job:
        (tmp_path / "crash_from").write_text("2")
        job.start(2, min_np=1, max_np=4, blacklist_cooldown_range=(1, 2))
        job.wait_for(lambda: job.max_step() >= 3, what="the first steps")
        job.set_hosts("localhost:3")
        r = job.wait(90)
        assert r.returncode == 0, r.reason
        assert check_consistent(job.done(), 60) == [2] * 60
        tries = len(job.pids()) - 2
        assert tries >= 1 and capfd.readouterr().err.count("before it joined a round") == tries
        assert job.leftovers() == []


def test_an_empty_discovery_output_for_a_few_seconds_keeps_the_job(tmp_path):
    """A script that prints nothing for a while (an API hiccup): the workers, the only holders of
    the state, keep training; the job neither shrinks nor fails."""
    with ElasticJob(tmp_path, steps=60, commit=2, hosts=f"{A}:2") as job:
        job.start(2, min_np=1)
        job.wait_for(lambda: job.max_step() >= 3, what="the first steps")
        job.set_hosts("")
        time.sleep(2.0)
        job.set_hosts(f"{A}:2")
        r = job.wait(90)
        assert r.returncode == 0, r.reason
        assert check_consistent(job.done(), 60) == [2] * 60
        assert all(d["resets"] == 0 for d in job.done().values()), job.done()
        assert job.leftovers() == []


@pytest.mark.parametrize("limit, ok", [(1, False), (2, True)])
def test_the_reset_limit_with_hosts_changing_twice(tmp_path, limit, ok):
    """Horovod's test_reset_limit: one host, then two, then only the second: two resets."""
    with ElasticJob(tmp_path, steps=80, commit=2, hosts=f"{A}:2") as job:
        job.start(2, min_np=2, max_np=4, reset_limit=limit)
        job.wait_for(lambda: job.max_step() >= 3, what="the first steps")
        job.set_hosts(f"{A}:2,{B}:2")
        job.wait_size(4)
        job.set_hosts(f"{B}:2")
        r = job.wait(90)
        if ok:
            assert r.returncode == 0, r.reason
            assert check_consistent(job.done(), 80)[-1] == 2
        else:
            assert r.returncode == 1, r.reason
            assert ("Horovod was shutdown because number of resets during elastic job exceeded limit: 1"
                    in r.reason), r.reason
        assert job.leftovers() == []


def test_max_np_unset_runs_every_listed_slot(tmp_path):
    """-np 2 --min-np 2 -H a:2,b:2 without --max-np: 4 ranks, as horovodrun."""
    import dataclasses

    from appliance.launcher import LaunchConfig
    from appliance.launcher.run import run

    with ElasticJob(tmp_path, steps=6) as job:
        config = LaunchConfig.create(job.command(), 2, hosts=f"{A}:2,{B}:2", min_np=2, timeout=60,
                                     env={"APPLIANCE_STOP_GRACE": "1"})
        config = dataclasses.replace(config, elastic=dataclasses.replace(config.elastic, max_np=None))
        r = run(config, echo=False, capture=True)
        assert r.returncode == 0, r.reason
        assert check_consistent(job.done(), 6) == [4] * 6
        assert job.leftovers() == []


def test_a_discovery_run_in_flight_when_the_job_ends_is_killed(tmp_path):
    """The script hangs from its third run on: when the job ends, nothing of it is left."""
    from fixtures.elastic import alive

    with ElasticJob(tmp_path, steps=30, hosts=f"{A}:1") as job:
        n, pids = tmp_path / "runs", tmp_path / "hung.pid"
        job.script.write_text(f"#!/bin/sh\nn=$(cat {n} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {n}\n"
                              f"if [ $n -ge 3 ]; then echo $$ > {pids}; exec sleep 100000; fi\ncat {job.hosts_file}\n")
        job.start(1, env={"APPLIANCE_DISCOVERY_TIMEOUT": "3600"})
        r = job.wait(90)
        assert r.returncode == 0, r.reason
        pid = int(pids.read_text())
        end = time.monotonic() + 3
        while alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
        assert not alive(pid), "the hung discovery run outlived the job"
        assert job.leftovers() == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_hung_first_discovery_ends_the_launcher_at_once(tmp_path, sig):
    from fixtures.elastic import alive

    script, pids = tmp_path / "h.sh", tmp_path / "hung.pid"
    script.write_text(f"#!/bin/sh\necho $$ > {pids}\nexec sleep 100000\n")
    script.chmod(0o755)
    p = subprocess.Popen([sys.executable, "-m", "appliance", "launch", "-np", "1", "--min-np", "1",
                          "--host-discovery-script", str(script), "--", sys.executable, "-c", "pass"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         env={**os.environ, "APPLIANCE_DISCOVERY_TIMEOUT": "3600"})
    try:
        end = time.monotonic() + 30
        while not pids.exists() and time.monotonic() < end:
            time.sleep(0.05)
        assert pids.exists(), "the discovery script never ran"
        time.sleep(0.3)
        sent = time.monotonic()
        p.send_signal(sig)
        _, err = p.communicate(timeout=10)
        took = time.monotonic() - sent
        assert p.returncode == 128 + sig and took < 2.0, (p.returncode, took, err.decode(errors="replace"))
        pid = int(pids.read_text())
        end = time.monotonic() + 2
        while alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
        assert not alive(pid)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
        if pids.exists():
            try:
                os.kill(int(pids.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
