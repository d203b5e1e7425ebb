"""The same two nodes reached by srun and over SSH: a Slurm whose nodes are the SSH tier's simulated hosts.

The module builds two simulated hosts (``tests/fixtures/netns.py``: a network namespace each with
its own address, hostname and a real sshd keyed by ``appliance keys``) and a Slurm cluster
(``fixtures.slurmcluster.SlurmCluster``) whose two slurmd run inside those namespaces, named by the hosts'
hostnames. Inside one allocation, ``appliance launch`` then starts the same four ranks on the same
two nodes with srun (the default there) and with ``--launcher ssh`` (over SSH, preflight included),
so the two launchers can be compared; each run's launch-to-first-allreduce time is printed
(``MEASURE``, with ``-s``).

Needs root, iproute2 and OpenSSH's sshd (the SSH tier's prerequisites) besides Slurm's.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fixtures import RANKS, ROOT, netns
from fixtures.slurmcluster import SlurmCluster, missing_tools

LAYOUT = RANKS / "slurm_layout.py"
PY = sys.executable

pytestmark = [pytest.mark.slurm, pytest.mark.ssh]


@pytest.fixture(scope="module")
def nodes(request):
    why = netns.available() or (f"{', '.join(missing_tools())} not found" if missing_tools() else None)
    if why:
        if request.config.getoption("--strict-prereqs"):
            pytest.fail(f"Slurm over simulated hosts: {why}")
        pytest.skip(f"Slurm over simulated hosts: {why}")
    home_cache = os.path.expanduser("~/.cache")  # sshd's StrictModes refuses keys below /tmp
    os.makedirs(home_cache, mode=0o755, exist_ok=True)
    base = tempfile.mkdtemp(prefix="appliance-slurm-ssh-", dir=home_cache)
    shared = os.path.join(base, "share")
    r = subprocess.run([PY, "-m", "appliance", "keys", "--shared", shared], capture_output=True, text=True,
                       cwd=str(ROOT), timeout=60)
    assert r.returncode == 0, r.stderr
    net = None
    try:
        net = netns.Cluster(2, shared, base)
        specs = [(h.hostname, h.address, h.ns) for h in net.hosts]
        with SlurmCluster(nodes=specs, ctld_addr=net.primary_addr) as slurm:
            yield slurm, net, base, shared
    finally:
        if net is not None:
            net.close()
        shutil.rmtree(base, ignore_errors=True)


def _launch(slurm, base: str, shared: str, name: str, extra: list[str]) -> tuple[float, list[str]]:
    out = os.path.join(base, name)
    home = os.path.join(base, f"home-{name}")
    os.makedirs(out)
    os.makedirs(home)
    launch = [PY, "-m", "appliance", "launch", "-np", "4", *extra, "--", PY, str(LAYOUT), "once", out]
    argv = ["salloc", "-N2", "--ntasks-per-node=2", "--", "sh", "-c", f'date +%s.%N > {out}/t0; exec "$@"', "sh",
            *launch]
    slurm.wait_idle(15)
    r = slurm.run(argv, env={"HOME": home, "PYTHONPATH": str(ROOT), "APPLIANCE_SHARED": shared}, cwd=str(ROOT),
                  timeout=120)
    assert r.returncode == 0, r.stderr[-4000:]
    t0 = float(Path(out, "t0").read_text())
    reports = [json.loads(Path(out, f"rank{k}.json").read_text()) for k in range(4)]
    assert {rep["sum"] for rep in reports} == {10.0}
    assert slurm.wait_no_strays(5) == {}
    return max(rep["t_first"] for rep in reports) - t0, [rep["node"] for rep in reports]


def test_srun_and_ssh_start_the_same_ranks_on_the_same_nodes(nodes):
    slurm, net, base, shared = nodes
    names = [h.hostname for h in net.hosts]
    key = os.path.join(shared, "ssh", "id_ed25519")
    start = time.monotonic()
    srun_s, srun_nodes = _launch(slurm, base, shared, "srun", [])
    ssh_s, ssh_nodes = _launch(slurm, base, shared, "ssh", ["--launcher", "ssh", "-p", str(netns.PORT), "-i", key])
    expected = [names[0], names[0], names[1], names[1]]
    assert srun_nodes == expected and ssh_nodes == expected
    print(f"\nMEASURE same two nodes, launcher start -> every rank past its first allreduce: srun {srun_s:.3f} s, "
          f"ssh {ssh_s:.3f} s")
    assert time.monotonic() - start < 120
