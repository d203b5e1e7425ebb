"""Elastic jobs over real hosts: the SSH tier's network-namespace hosts, each with its own sshd,
address and hostname (``tests/fixtures/netns.py``), plus this machine. Written from Horovod's documented
behaviour (docs/elastic.rst): hosts added then removed (1 and 2 slots), one rank failing by
exception and by SIGKILL with a discovery script and with a fixed -H list, every rank failing, the
reset limit, a blacklisted host returning after its cool-down, --min-np not reachable within the
elastic timeout, a host's network cut mid-training, and a host that leaves discovery keeping
nothing open there (no SSH session, no launcher fd or thread) and working again when listed again.

Every test asserts effects (exit code, the state the finished workers report, which processes
were started, time bounds) and that nothing is left: no process on this machine, none in any host's
namespace (ranks, stubs, sshd sessions: so no store port either). Rank program:
``tests/ranks/elastic_steps.py`` (``tests/fixtures/elastic.py`` drives it).
"""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from fixtures.elastic import ElasticJob, check_consistent
from fixtures.netns import PORT, sh

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(180)]


def start(job: ElasticJob, np: int, **kw) -> ElasticJob:
    return job.start(np, ssh_port=PORT, **kw)


def test_hosts_added_then_removed_over_ssh(cluster, tmp_path):
    """This machine alone, then host 1 with 2 slots joins (1 -> 3 ranks), then host 2 (3 -> 4),
    then this machine leaves (4 -> 3: rank 0 moves to host 1, which holds the same state)."""
    h1, h2 = cluster.hosts
    with ElasticJob(tmp_path, steps=120, commit=2, hosts="localhost:1") as job:
        start(job, 1, max_np=4)
        job.wait_for(lambda: job.max_step() >= 3, what="the first steps")
        job.set_hosts(f"localhost:1,{h1.address}:2")
        job.wait_size(3)
        job.set_hosts(f"localhost:1,{h1.address}:2,{h2.address}:1")
        job.wait_size(4)
        job.set_hosts(f"{h1.address}:2,{h2.address}:1")
        job.wait_size(3, step_after=job.max_step())
        r = job.wait()
        assert r.returncode == 0, r.reason
        sizes = check_consistent(job.done(), 120)
        assert sizes[0] == 1 and {3, 4} <= set(sizes) and sizes[-1] == 3
        assert sorted(job.pids()) == [0, 1, 2, 3] and sorted(job.done()) == [1, 2, 3]
        assert job.done()[1]["rank"] == 0
        assert job.leftovers() == []


@pytest.mark.parametrize("how", ["fail", "kill"])
@pytest.mark.parametrize("source", ["discovery", "fixed"])
def test_one_remote_rank_failing_removes_its_host_and_the_rest_go_on(cluster, tmp_path, how, source):
    h1, h2 = cluster.hosts
    hosts = f"localhost:1,{h1.address}:1,{h2.address}:1"
    with ElasticJob(tmp_path, steps=24, commit=3, hosts=hosts if source == "discovery" else None) as job:
        job.switch(how, 2, 7)  # worker 2: the rank on host 2
        start(job, 3, min_np=2, **({"hosts": hosts} if source == "fixed" else {}))
        r = job.wait()
        assert r.returncode == 0, r.reason
        assert check_consistent(job.done(), 24) == [3] * 6 + [2] * 18
        assert sorted(job.done()) == [0, 1]
        assert job.leftovers() == []


def test_every_rank_failing_fails_the_job_naming_them(cluster, tmp_path):
    h1, h2 = cluster.hosts
    with ElasticJob(tmp_path, steps=24) as job:
        for w in (0, 1):
            job.switch("fail", w, 4)
        start(job, 2, min_np=1, hosts=f"{h1.address}:1,{h2.address}:1")
        r = job.wait()
        assert r.returncode == 1 and "every rank failed" in r.reason, r.reason
        assert f"host {h1.address}" in r.reason and f"host {h2.address}" in r.reason
        assert job.done() == {} and job.leftovers() == []


@pytest.mark.parametrize("limit, ok", [(1, False), (2, True)])
def test_the_reset_limit(cluster, tmp_path, limit, ok):
    h1, h2 = cluster.hosts
    with ElasticJob(tmp_path, steps=24, commit=2) as job:
        job.switch("kill", 2, 4)
        job.switch("fail", 1, 9)
        start(job, 3, min_np=1, hosts=f"localhost:1,{h1.address}:1,{h2.address}:1", reset_limit=limit)
        r = job.wait()
        if ok:
            assert r.returncode == 0, r.reason
            assert check_consistent(job.done(), 24)[-1] == 1
        else:
            assert r.returncode == 1 and "--reset-limit 1" in r.reason, r.reason
        assert job.leftovers() == []


def test_a_blacklisted_host_returns_after_its_cooldown(cluster, tmp_path):
    h1, _ = cluster.hosts
    with ElasticJob(tmp_path, steps=100, commit=2, hosts=f"localhost:1,{h1.address}:1") as job:
        job.switch("kill", 1, 4)
        start(job, 2, min_np=1, blacklist_cooldown_range=(1, 2))
        r = job.wait()
        assert r.returncode == 0, r.reason
        sizes = check_consistent(job.done(), 100)
        assert sizes[:2] == [2] * 2 and 1 in sizes and sizes[-1] == 2  # killed at step 4: step 2 was the commit
        assert sorted(job.done()) == [0, 2]  # a new worker on the returned host
        assert json.loads((tmp_path / "up.2").read_text())["size"] == 2
        assert job.leftovers() == []


def test_min_np_not_reachable_within_the_elastic_timeout_fails_the_job(cluster, tmp_path):
    h1, h2 = cluster.hosts
    with ElasticJob(tmp_path, steps=500) as job:
        job.switch("kill", 1, 3)
        start(job, 2, min_np=2, hosts=f"{h1.address}:1,{h2.address}:1", elastic_timeout=3)
        r = job.wait()
        assert r.returncode == 1 and "fewer than --min-np 2 slots" in r.reason, r.reason
        assert r.elapsed_s < 30
        assert job.leftovers() == []


def test_a_hosts_network_cut_mid_training(cluster, tmp_path):
    """Host 2's switch port goes down (nothing closes, packets vanish). The survivors' runtimes
    notice after the heartbeat timeout and name the lost rank in their joins, so the driver drops
    that worker at once (before SSH notices the silence) and the job goes on at 2 ranks from the
    last commit; host 2's stub stops the rank there on its own."""
    h1, h2 = cluster.hosts
    heartbeat = 2.0
    with ElasticJob(tmp_path, steps=150, commit=2, step_s=0.05) as job:
        start(job, 3, min_np=2, hosts=f"localhost:1,{h1.address}:1,{h2.address}:1",
              env={"APPLIANCE_HEARTBEAT_TIMEOUT": str(heartbeat)})
        port = f"sw{h2.index}"
        try:
            job.wait_for(lambda: job.max_step() >= 10, what="steps at 3 ranks")
            sh("ip", "-n", cluster.c.switch, "link", "set", port, "down")
            cut = time.time()
            job.wait_for(lambda: any(p["size"] == 2 for p in job.progress().values()), limit=30,
                         what="a step at 2 ranks")
            first = min(p["t"] for p in job.progress().values() if p["size"] == 2)
            recovered = first - cut
            print(f"\nnetwork cut: first step at the new size {recovered:.2f} s after the cut "
                  f"(heartbeat timeout {heartbeat:g} s)")
            assert recovered < heartbeat + 5.0, recovered
            r = job.wait()
        finally:
            sh("ip", "-n", cluster.c.switch, "link", "set", port, "up", check=False)
        assert r.returncode == 0, r.reason
        sizes = check_consistent(job.done(), 150)
        assert sizes[:10] == [3] * 10 and sizes[-1] == 2
        assert sorted(job.done()) == [0, 1]
        assert job.leftovers() == []


# -- Horovod's semantics on two real hosts ------------------------------------------------------------
def test_a_new_host_is_announced_within_a_discovery_interval_before_it_is_checked(cluster, tmp_path):
    """Horovod's elastic test program waits 3 s for the notice and then fails: rank 0 (this
    machine) must get it within ~1.5 s of the script listing host 1, before the SSH check and
    before any worker starts there."""
    h1, _ = cluster.hosts
    with ElasticJob(tmp_path, steps=60, commit=2, hosts="localhost:1") as job:
        start(job, 1, max_np=3)
        job.wait_for(lambda: job.max_step() >= 3, what="the first steps")
        listed = time.time()
        job.set_hosts(f"localhost:1,{h1.address}:2")
        job.wait_for(lambda: (tmp_path / "notice.0").exists(), limit=10, what="rank 0's notice")
        told = json.loads((tmp_path / "notice.0").read_text())[0] - listed
        job.wait_for(lambda: (tmp_path / "born.1").exists(), limit=30, what="a worker on host 1")
        born = json.loads((tmp_path / "born.1").read_text())
        print(f"\nnotice {told:.2f} s after host 1 was listed")
        assert told < 1.5, told
        job.wait_size(3)
        r = job.wait()
        assert r.returncode == 0, r.reason
        assert born and 3 in check_consistent(job.done(), 60)
        assert job.leftovers() == []


def test_every_rank_on_two_hosts_failing_at_once_ends_the_job_within_5_s(cluster, tmp_path):
    HOROVOD_FAILED = "Horovod detected that one or more processes exited with non-zero status"
    h1, h2 = cluster.hosts
    with ElasticJob(tmp_path, steps=40, commit=1, step_s=0.1) as job:
        for w in range(4):
            job.switch("fail", w, 6)
        start(job, 4, min_np=1, hosts=f"{h1.address}:2,{h2.address}:2", elastic_timeout=60)
        job.wait_for(lambda: len(job.progress()) == 4 and min(p["step"] for p in job.progress().values()) >= 5,
                     what="step 5 on every rank")
        failed = max(p["t"] for p in job.progress().values())
        r = job.wait(60)
        took = time.time() - failed
        print(f"\nevery rank failed: the launch returned {took:.2f} s after the last step")
        assert r.returncode != 0 and HOROVOD_FAILED in r.reason, r.reason
        for rank, host in enumerate((h1, h1, h2, h2)):
            assert f"rank {rank}, host {host.address})" in r.reason, r.reason
        assert took < 5.0, took
        assert job.done() == {} and job.leftovers() == []


@pytest.mark.parametrize("limit, ok", [(1, False), (2, True)])
def test_the_reset_limit_with_hosts_changing_twice(cluster, tmp_path, limit, ok):
    """Horovod's test_reset_limit on two hosts: host 1, then hosts 1 and 2, then host 2 alone."""
    h1, h2 = cluster.hosts
    with ElasticJob(tmp_path, steps=80, commit=2, hosts=f"{h1.address}:2") as job:
        start(job, 2, min_np=2, max_np=4, reset_limit=limit)
        job.wait_for(lambda: job.max_step() >= 3, what="the first steps")
        job.set_hosts(f"{h1.address}:2,{h2.address}:2")
        job.wait_size(4)
        job.set_hosts(f"{h2.address}:2")
        r = job.wait()
        if ok:
            assert r.returncode == 0, r.reason
            assert check_consistent(job.done(), 80)[-1] == 2
        else:
            assert r.returncode == 1 and ("Horovod was shutdown because number of resets during elastic job "
                                          "exceeded limit: 1") in r.reason, r.reason
        assert job.leftovers() == []


def launcher_resources(n: int = 10) -> tuple[int, int]:
    """This process's fds and threads (the launch runs in a thread here): the least of ``n``
    samples over ~1 s, since a discovery run (its process, pipes, reader) comes and goes."""
    fds, threads = [], []
    for _ in range(n):
        fds.append(len(os.listdir("/proc/self/fd")))
        threads.append(threading.active_count())
        time.sleep(0.1)
    return min(fds), min(threads)


def _resources_said() -> str:
    """This process's threads and open files, by name, for a message."""
    fds = []
    for f in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink(f"/proc/self/fd/{f}"))
        except OSError:
            pass
    return f"threads {sorted(t.name for t in threading.enumerate())}, fds {sorted(fds)}"


def test_a_host_that_leaves_discovery_keeps_no_session_there_and_works_again_when_listed_again(cluster, tmp_path,
                                                                                                monkeypatch):
    """This machine and host 1, then host 2 listed (2 -> 3 ranks), then host 2 taken out (3 -> 2):
    once its worker has left, nothing of the job is left on host 2 (no sshd session, no stub) and
    the launcher holds no more fds or threads than before host 2 came; listed again, it runs a rank."""
    h1, h2 = cluster.hosts
    # the job's view and record (their threads and files are the soak's to check) stay out of the count
    monkeypatch.setenv("APPLIANCE_VIEW", "off")
    monkeypatch.setenv("APPLIANCE_RECORD_DIR", "off")
    with ElasticJob(tmp_path, steps=400, commit=2, hosts=f"localhost:1,{h1.address}:1") as job:
        start(job, 2, min_np=2, max_np=3)
        job.wait_size(2, step_after=3)
        before = launcher_resources()
        assert h2.pids() == []
        job.set_hosts(f"localhost:1,{h1.address}:1,{h2.address}:1")
        job.wait_size(3)
        assert h2.pids() != []                                  # its session and the rank's stub
        job.set_hosts(f"localhost:1,{h1.address}:1")
        job.wait_size(2, step_after=job.max_step())
        job.wait_for(lambda: h2.pids() == [], limit=10, what="nothing of the job left on host 2")
        try:
            job.wait_for(lambda: launcher_resources() <= before, limit=10,
                         what=f"the launcher back to {before} fds and threads")
        except AssertionError as e:
            raise AssertionError(f"{e}: now {launcher_resources()}: {_resources_said()}") from None
        job.set_hosts(f"localhost:1,{h1.address}:1,{h2.address}:1")
        job.wait_size(3, step_after=job.max_step())
        last = job.max_step() + 6
        (tmp_path / "stop").write_text(str(last))
        r = job.wait()
        assert r.returncode == 0, r.reason
        sizes = check_consistent(job.done(), last)
        assert sizes[-1] == 3 and sorted(job.done()) == [0, 1, 3]
        assert job.leftovers() == []
