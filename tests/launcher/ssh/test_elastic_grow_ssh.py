"""An elastic job that starts at one rank and grows over real sshd hosts (the SSH tier's
network-namespace hosts, ``tests/fixtures/netns.py``), started by ``horovodrun`` with Horovod's own
elastic pattern (``tests/ranks/elastic_grow.py``): this machine alone, then host 1, then host 2
(1 -> 2 -> 3 ranks), then this machine alone again (the hosts leave discovery: their workers exit
0), then host 1 again (a new worker there). The same effects as the local test
(``tests/launcher/test_elastic_grow.py``): steps go on at every size within a bound, every rank holds
the same model after every step, the final model is the replay of the sizes, rc 0, nothing left
on this machine or in any host's namespace.
"""
from __future__ import annotations

import pytest

from fixtures.elastic_grow import GrowJob
from fixtures.netns import PORT

pytest.importorskip("torch")
pytestmark = [pytest.mark.ssh, pytest.mark.timeout(280)]


def test_a_job_goes_1_2_3_1_2_over_ssh(cluster, tmp_path):
    h1, h2 = cluster.hosts
    with GrowJob(tmp_path, "localhost:1") as job:
        job.start(["horovodrun", "-np", "1", "--min-np", "1", "--max-np", "3", "-p", str(PORT)])
        job.steps(1)
        for hosts, size in ((f"localhost:1,{h1.address}:1", 2), (f"localhost:1,{h1.address}:1,{h2.address}:1", 3),
                            ("localhost:1", 1), (f"localhost:1,{h1.address}:1", 2)):
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
