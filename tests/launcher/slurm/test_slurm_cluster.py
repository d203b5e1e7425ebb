"""The Slurm tier's fixture itself (``tests/fixtures/slurmcluster.py``): a real two-node Slurm answers
``srun`` on both named nodes and leaves nothing behind."""
from __future__ import annotations

import os
import time

import pytest

from fixtures.slurmcluster import SlurmCluster

pytestmark = pytest.mark.slurm


def test_srun_runs_one_task_on_each_named_node(slurm):
    r = slurm.run(["srun", "-N2", "-n2", "hostname"], timeout=30)
    assert r.returncode == 0, r.stderr + slurm.logs()
    assert sorted(r.stdout.split()) == ["node1", "node2"]


def test_tasks_resolve_node_names_and_see_slurm_layout(slurm):
    r = slurm.run(["srun", "-N2", "-n3", "sh", "-c",
                   'echo "$SLURM_PROCID $SLURMD_NODENAME $(hostname) $SLURM_TASKS_PER_NODE '
                   '$(getent hosts node1 | cut -d" " -f1)"'], timeout=30)
    assert r.returncode == 0, r.stderr
    rows = sorted(tuple(line.split()) for line in r.stdout.splitlines())
    assert rows == [("0", "node1", "node1", "2,1", "127.0.0.2"), ("1", "node1", "node1", "2,1", "127.0.0.2"),
                    ("2", "node2", "node2", "2,1", "127.0.0.2")]


def test_two_clusters_at_once_and_teardown_leaves_no_process():
    start = time.monotonic()
    with SlurmCluster() as a, SlurmCluster() as b:
        for c in (a, b):
            r = c.run(["srun", "-N2", "-n2", "hostname"], timeout=30)
            assert r.returncode == 0, r.stderr + c.logs()
        pids = a.in_cluster() + b.in_cluster()
        dirs = [a.dir, b.dir]
        assert pids and all(d.exists() for d in dirs)
    assert time.monotonic() - start < 30
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z"
    assert not any(d.exists() for d in dirs)
    assert a.stop_s < 5 and b.stop_s < 5
