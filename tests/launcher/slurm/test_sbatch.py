"""The batch scripts users copy (``slurm/train.sbatch``, ``slurm/train-docker.sbatch``).

``train.sbatch`` runs for real on the two-node Slurm of ``tests/fixtures/slurmcluster.py``: the default
training job on 2 nodes x 2 tasks, direct ``srun`` through ``hvd.init()``, to a checkpoint that
loads. The Docker variant is not run (no Docker in this tier): both scripts pass ``bash -n``, and
the Docker one runs once against stand-ins for ``scontrol``, ``srun`` and ``appliance`` that record
their arguments, to check the commands it builds from the allocation (-np, -H, the secondaries on
every node but the first, and their stop at the end even when the job fails).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from fixtures import ROOT

PLAIN = ROOT / "slurm" / "train.sbatch"
DOCKER = ROOT / "slurm" / "train-docker.sbatch"

pytestmark = pytest.mark.slurm


@pytest.mark.parametrize("script", [PLAIN, DOCKER], ids=lambda p: p.name)
def test_scripts_parse(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr


def test_train_sbatch_trains_the_default_job_to_a_checkpoint(slurm, tmp_path):
    import torch

    shared, home = tmp_path / "share", tmp_path / "home"
    shared.mkdir()
    home.mkdir()
    start = time.monotonic()
    r = slurm.run(["sbatch", "--wait", "--chdir", str(tmp_path), "--output", str(tmp_path / "job.out"),
                   str(PLAIN), "--epochs", "2", "--device", "cpu"],
                  env={"HOME": str(home), "PYTHON": sys.executable, "APPLIANCE_SHARED": str(shared)}, timeout=240)
    elapsed = time.monotonic() - start
    output = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert r.returncode == 0, r.stdout + r.stderr + output
    model = shared / "models" / "digits"
    ckpt = torch.load(model / "checkpoint.pt", weights_only=False)
    assert ckpt["epoch"] == 2 and ckpt["size"] == 4 and "model" in ckpt
    metrics = json.loads((model / "metrics.json").read_text())
    assert metrics["size"] == 4 and len(metrics["epochs"]) == 2
    job = r.stdout.split()[-1]
    secret = home / ".appliance" / "slurm" / f"job-{job}.secret"
    assert secret.stat().st_mode & 0o777 == 0o600
    print(f"sbatch --wait train.sbatch (2 nodes x 2 tasks, 2 epochs): {elapsed:.2f} s")


STUB = r"""#!/bin/bash
printf '%s\n' "$(basename "$0") $*" >> "$STUB_LOG"
case "$(basename "$0") $1" in
  "scontrol show") printf 'node1\nnode2\nnode3\n' ;;
  "srun "*) while [[ $1 == -* ]]; do shift; done; exec "$@" ;;
  "appliance primary") exit "${PRIMARY_EXIT:-0}" ;;
esac
"""


@pytest.mark.parametrize("primary_exit", [0, 3])
def test_docker_sbatch_builds_its_commands_from_the_allocation(tmp_path, primary_exit):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in ("scontrol", "srun", "appliance"):
        (bin_ / name).write_text(STUB)
        (bin_ / name).chmod(0o755)
    log = tmp_path / "log"
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "STUB_LOG": str(log),
           "SLURM_JOB_NODELIST": "node[1-3]", "PRIMARY_EXIT": str(primary_exit), "APPLIANCE_SHARED": "/srv/share"}
    r = subprocess.run(["bash", str(DOCKER), "--epochs", "3"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == primary_exit, r.stderr
    calls = log.read_text().splitlines()
    secondary = ("srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --exclude=node1 appliance secondary "
                 "--ssh-port 12345 --shared /srv/share --image appliance:latest")
    assert calls == [
        "scontrol show hostnames node[1-3]",
        "appliance keys --shared /srv/share",
        secondary,
        "appliance secondary --ssh-port 12345 --shared /srv/share --image appliance:latest",
        "appliance primary -np 6 -H localhost:2,node2:2,node3:2 -p 12345 --shared /srv/share "
        "--image appliance:latest -- python -m train --epochs 3",
        secondary + " --stop",
        "appliance secondary --ssh-port 12345 --shared /srv/share --image appliance:latest --stop",
    ]
