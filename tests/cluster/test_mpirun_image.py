"""OpenMPI's mpirun of the image, from a primary container, runs a job on two secondary containers:
its daemons reach them over ssh with the cluster's key and port (no -mca plm_rsh_args; the image's
ssh config), the ranks bootstrap through PMIx, and Horovod's usual line trains the default job.
Effects asserted: exit code, rank 0's epoch line, which host each rank ran on, nothing left."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.timeout(420, func_only=True)]


def test_mpirun_from_the_primary_trains_on_two_secondaries(cluster):
    c = cluster
    c.secondary("node2")
    c.secondary("node3")
    n2, n3 = c.host("node2"), c.host("node3")
    line = ["mpirun", "-np", "2", "-H", f"{n2}:1,{n3}:1", "-bind-to", "none", "-map-by", "slot",
            "-x", "LD_LIBRARY_PATH", "python", "-m", "train", "--epochs", "1"]
    box = c.engine.containers.run(
        c.image, ["primary", *line], name=f"{c.prefix}-mpirun", hostname=f"{c.id}-mpirun", detach=True, init=True,
        network=c.network, working_dir=c.shared, shm_size="1g",
        volumes={c.shared: {"bind": c.shared, "mode": "rw"}},
        environment={"APPLIANCE_SHARED": c.shared, "APPLIANCE_SSH_PORT": "12345"})
    try:
        rc = box.wait(timeout=300)["StatusCode"]
        out = box.logs().decode(errors="replace")
    finally:
        box.remove(force=True)
    assert rc == 0, out[-4000:]
    assert "epoch 1/1" in out, out[-4000:]
    devices = [ln for ln in out.splitlines() if ln.startswith("devices: ")]
    assert devices and f"@{n2}" in devices[0] and f"@{n3}" in devices[0], out[-4000:]  # one rank on each
    assert "plm_rsh" not in " ".join(line)
    assert c.job_python("node2") == [] and c.job_python("node3") == []
