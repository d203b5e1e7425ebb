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

import pytest

from fixtures.elastic_grow import GrowJob

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(280)

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"


@pytest.mark.parametrize("cli", ["appliance launch", "horovodrun"])
def test_a_job_started_at_one_rank_grows_to_2_and_3(tmp_path, cli):
    with GrowJob(tmp_path, f"{A}:1") as job:
        job.start([*cli.split(), "-np", "1", "--min-np", "1", "--max-np", "3"])
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
