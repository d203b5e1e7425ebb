"""Fixtures of the Slurm tier: a real two-node Slurm per test module (``tests/slurm/_cluster.py``).

``slurm_cluster``: a running ``SlurmCluster`` shared by the tests of one module (start ~0.2 s,
teardown ~1 s), torn down even when a test fails, asserting no daemon survives. Before each test
that uses ``slurm``, the cluster is idle again (no job left, both nodes idle), and after it no
process of a job may be left in the cluster (the test fails naming them, and they are killed).

Missing tools (munge, slurm-wlm, util-linux's unshare/nsenter) skip the tier locally and fail it
under ``--strict-prereqs`` (CI). Needs root (daemons as SlurmUser root, mount namespaces).
"""
from __future__ import annotations

import os

import pytest

from _cluster import SlurmCluster, missing_tools


def _prereqs(config) -> str | None:
    missing = missing_tools()
    if missing:
        return f"Slurm tier: {', '.join(missing)} not found (apt-get install slurm-wlm munge; .ci/run installs them)"
    if os.geteuid() != 0:
        return "Slurm tier: needs root (slurmd runs as SlurmUser root; mount and UTS namespaces)"
    return None


@pytest.fixture(scope="module")
def slurm_cluster(request):
    why = _prereqs(request.config)
    if why:
        if request.config.getoption("--strict-prereqs"):
            pytest.fail(why)
        pytest.skip(why)
    with SlurmCluster() as cluster:
        yield cluster


@pytest.fixture
def slurm(slurm_cluster):
    """The module's cluster, idle at the start of the test; no job process may outlive the test."""
    slurm_cluster.wait_idle(15)
    yield slurm_cluster
    left = slurm_cluster.wait_no_strays(5)
    if left:
        for pid in left:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        pytest.fail(f"processes of the test's jobs outlived it: {left}")
