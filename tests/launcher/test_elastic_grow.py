"""An elastic job that starts at one rank and grows, on this machine, started by the real command
lines (``horovodrun``, ``appliance launch``) with Horovod's own elastic pattern
(``tests/ranks/elastic_grow.py``: ``DistributedOptimizer`` built once before ``hvd.elastic.run``,
``TorchState``, a commit every step). "Hosts" are loopback addresses (127.0.0.x), which an elastic
job keeps apart; a host leaves by leaving the discovery script's output.

Each test asserts effects: steps go on at every new size (a hang fails the test within the
``GrowJob.steps`` bound, not at pytest's), every rank holds the same model after every step (so
after each growth the newcomers got rank 0's state), the final model equals a one-process replay
of the sizes the steps ran at, every worker saw HOROVOD_ELASTIC=1, rc 0 and no process left.
The same over real sshd hosts: ``ssh/test_elastic_grow_ssh.py``.
"""
from __future__ import annotations

import time

import pytest

from fixtures.elastic_grow import GrowJob

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(280)

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"


def test_a_job_started_at_one_rank_grows_to_2_and_3(tmp_path):
    """``appliance launch``; horovodrun's same 1 -> 2 -> 3 is the start of the next test."""
    with GrowJob(tmp_path, f"{A}:1") as job:
        job.start(["appliance", "launch", "-np", "1", "--min-np", "1", "--max-np", "3"])
        job.steps(1)
        job.set_hosts(f"{A}:1,{B}:1")
        job.steps(2)
        job.set_hosts(f"{A}:1,{B}:1,{C}:1")
        job.steps(3)
        job.stop()
        assert job.wait() == 0, job.tail()
        sizes = job.check_equal()
        assert [s for i, s in sorted(sizes.items()) if i == 1 or s != sizes[i - 1]] == [1, 2, 3], sizes
        job.check_replay(sizes)
        assert len(job.pids()) == 3 and job.leftovers() == []


def test_a_job_goes_1_2_3_1_2_and_every_size_trains(tmp_path):
    """Grows one host at a time, shrinks back to the first host alone (the others leave discovery:
    their workers exit 0), then grows again onto a host that was listed before (a new worker)."""
    with GrowJob(tmp_path, f"{A}:1") as job:
        job.start(["horovodrun", "-np", "1", "--min-np", "1", "--max-np", "3"])
        job.steps(1)
        for hosts, size in ((f"{A}:1,{B}:1", 2), (f"{A}:1,{B}:1,{C}:1", 3), (f"{A}:1", 1), (f"{A}:1,{B}:1", 2)):
            job.set_hosts(hosts)
            job.steps(size)
        job.stop()
        assert job.wait() == 0, job.tail()
        sizes = job.check_equal()
        changes = [s for i, s in sorted(sizes.items()) if i == 1 or s != sizes[i - 1]]
        assert changes == [1, 2, 3, 1, 2], changes
        job.check_replay(sizes)
        assert len(job.pids()) == 4 and sorted(job.done()) == ["0", "3"], job.done().keys()
        assert job.leftovers() == []


def test_an_adasum_job_started_at_one_rank_grows_with_one_algorithm_everywhere(tmp_path):
    """``op=hvd.Adasum``: the optimizer rank 0 built at one rank is the delta optimizer, as the new
    ranks' (a gradient optimizer there would read the new ranks' combined deltas as gradients, and
    the ranks' models would part at the first step at 2 ranks)."""
    with GrowJob(tmp_path, f"{A}:1") as job:
        job.start(["horovodrun", "-np", "1", "--min-np", "1", "--max-np", "2"], modes=("adasum",))
        job.steps(1)
        job.set_hosts(f"{A}:1,{B}:1")
        job.steps(2)
        job.stop()
        assert job.wait() == 0, job.tail()
        sizes = job.check_equal()
        assert sizes[1] == 1 and sizes[max(sizes)] == 2, sizes
        assert job.leftovers() == []


def test_a_host_found_while_the_first_round_starts_is_grown_onto(tmp_path):
    """The host appears after rank 0's round is formed but before the script reaches
    ``hvd.elastic.run`` (its model takes 4 s to build): the notice that came while nobody listened
    yet reaches the state when ``run`` starts, so the first commit moves the job to 2 ranks (a lost
    notice left the new worker waiting for the next round until --elastic-timeout)."""
    with GrowJob(tmp_path, f"{A}:1") as job:
        job.start(["horovodrun", "-np", "1", "--min-np", "1", "--max-np", "2"], modes=("slow",))
        end = time.monotonic() + 60
        while not (tmp_path / "inited.0").exists():
            assert time.monotonic() < end and job.proc.poll() is None, job.tail()
            time.sleep(0.05)
        job.set_hosts(f"{A}:1,{B}:1")
        job.steps(2)
        job.stop()
        assert job.wait() == 0, job.tail()
        sizes = job.check_equal()
        assert sizes[1] == 1 and sizes[max(sizes)] == 2 and sum(1 for s in sizes.values() if s == 1) <= 3, sizes
        job.check_replay(sizes)
        assert job.leftovers() == []


def test_a_host_found_just_as_a_round_is_released_is_grown_onto(tmp_path):
    """1 -> 2 ranks, and the third host is listed the moment the launcher says round 2 is
    formed: its notice reaches the members while they are still taking in the round (before
    their state's reset), is kept for that round and acted on at its first commit (a lost notice
    left the job at 2 ranks for good, the new worker waiting until --elastic-timeout)."""
    with GrowJob(tmp_path, f"{A}:1") as job:
        job.start(["horovodrun", "-np", "1", "--min-np", "1", "--max-np", "3"])
        job.steps(1)
        job.set_hosts(f"{A}:1,{B}:1")
        end = time.monotonic() + 60
        while "round 2:" not in job.tail(1_000_000):
            assert time.monotonic() < end and job.proc.poll() is None, job.tail()
            time.sleep(0.02)
        job.set_hosts(f"{A}:1,{B}:1,{C}:1")
        job.steps(3)
        job.stop()
        assert job.wait() == 0, job.tail()
        sizes = job.check_equal()
        assert [s for i, s in sorted(sizes.items()) if i == 1 or s != sizes[i - 1]] == [1, 2, 3], sizes
        job.check_replay(sizes)
        assert job.leftovers() == []


@pytest.mark.parametrize("case", ["g02", "g03+g04", "g05"])
def test_the_probe_cases_of_a_job_grown_on_one_host(tmp_path, case):
    """The bad-input probe's cases, as it ran them (one host whose slots grow, horovodrun): g02 an
    allgather check of the model every step; g03 the plain script, run as g04 ran it: with the
    stall warning at 5 s and the shutdown at 10 s (nothing may stall now; the one difference of the
    two, so one run asserts both); g05 the control, 2 ranks grown to 3."""
    first, grown = (2, 3) if case == "g05" else (1, 2)
    modes = ("check",) if case == "g02" else ()
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "5", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "10"} if case == "g03+g04" else {}
    with GrowJob(tmp_path, f"localhost:{first}") as job:
        job.start(["horovodrun", "-np", str(first), "--min-np", "1", "--max-np", str(grown)], modes=modes, env=env)
        job.steps(first)
        job.set_hosts(f"localhost:{grown}")
        job.steps(grown, n=10)
        job.stop()
        assert job.wait() == 0, job.tail()
        sizes = job.check_equal()
        assert sizes[1] == first and sizes[max(sizes)] == grown and set(sizes.values()) == {first, grown}, sizes
        job.check_replay(sizes)
        assert "stall" not in job.tail(1_000_000), job.tail()
        assert job.leftovers() == []


def test_a_collective_before_elastic_run_on_a_joining_worker_ends_that_round_not_the_job(tmp_path):
    """The probe's g01: the script also broadcasts its parameters before ``hvd.elastic.run``, which
    Horovod's elastic docs forbid (the survivors are inside ``run`` and sync the state there; a
    joining worker's earlier collective can only meet that sync out of step). Horovod waits
    forever; here the mismatch stalls, the stall shutdown (5 s here) fails that round on every rank
    naming the broadcasts, and the job goes on: the round re-forms, at 2 ranks when the joining
    worker was already inside ``run`` then, else without it (it exits with the stall error in its
    own broadcast; its host takes no new worker). Never a hang, every finished worker consistent."""
    stall = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "2", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "5"}
    with GrowJob(tmp_path, f"{A}:1") as job:
        job.start(["horovodrun", "-np", "1", "--min-np", "1", "--max-np", "2"], modes=("top",), env=stall)
        job.steps(1)
        job.set_hosts(f"{A}:1,{B}:1")
        end = time.monotonic() + 90
        while "stalled for 5 s" not in job.tail(1_000_000):
            assert time.monotonic() < end, "no stall shutdown within 90 s:\n" + job.tail()
            assert job.proc.poll() is None, job.tail()
            time.sleep(0.2)
        job.steps(None, n=5)
        job.stop()
        assert job.wait() == 0, job.tail()
        said = job.tail(1_000_000)
        assert "broadcast '0.weight'" in said and "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" in said, said[-3000:]
        done = job.done()
        assert "0" in done and all(d["sizes"] == done["0"]["sizes"] for d in done.values()), done.keys()
        job.check_replay(dict(enumerate(done["0"]["sizes"], start=1)))
        assert job.leftovers() == []
