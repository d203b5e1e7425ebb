"""Ranks started by MPICH's hydra (``mpiexec.hydra``, Debian's mpich beside OpenMPI) bootstrap over
PMI-1 on the socket hydra hands them (PMI_FD): the torch script trains with no address, port or
secret from the user, with the layout ``appliance launch`` gives; nothing is left afterwards."""
from __future__ import annotations

import sys

import pytest

from fixtures import mpirun_lines as ml

pytestmark = pytest.mark.timeout(600)


def test_hydra_line_trains_with_appliance_launchs_layout(tmp_path, require_tool):
    require_tool("mpiexec.hydra", "MPICH's hydra (Debian's mpich)")
    job = ml.job_dir(tmp_path)
    rc, out, left = ml.run("mpiexec.hydra -n 3 python train.py", job, ml.env(APPLIANCE_VERBOSE="1"), timeout=240)
    assert rc == 0 and not left, out[-4000:]
    found = ml.reports(out)
    assert sorted(found) == [0, 1, 2] and all(r["same_weights"] for r in found.values()), out[-4000:]
    assert "appliance: under hydra, rank 0 on " in out and "(interface lo, from every rank on this host)" in out
    launch = f"{sys.executable} -m appliance launch -np 3 python train.py"
    rc, out, left = ml.run(launch, job, ml.env(), timeout=240)
    assert rc == 0 and not left, out[-4000:]
    assert ml.layout(ml.reports(out)) == ml.layout(found)
