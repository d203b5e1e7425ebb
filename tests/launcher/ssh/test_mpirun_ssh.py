"""The issue's third mpirun line across the SSH tier's two hosts (network namespaces with real sshd):
mpirun starts its daemons over ssh itself (the tier's key and port through OMPI_MCA_plm_rsh_agent
in the environment, the user's line untouched but for host names and the interface), the ranks
bootstrap through PMIx across hosts, train, and report the layout ``appliance launch`` gives on the
same hosts. A rank that cannot reach rank 0's chosen interface is one line naming both hosts and
the interface, within the start timeout, with nothing left on either host.
"""
from __future__ import annotations

import os
import sys

import pytest

from fixtures import mpirun_lines as ml
from fixtures.netns import PORT

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(600)]


def _env(ssh_cluster, **extra) -> dict:
    agent = (f"ssh -p {PORT} -i {ssh_cluster.key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
             "-o BatchMode=yes -o LogLevel=ERROR")
    return ml.env(HOME=ssh_cluster.home, OMPI_MCA_plm_rsh_agent=agent, **extra)


@pytest.fixture
def job(tmp_path, require_tool):
    require_tool("mpirun", "OpenMPI (openmpi-bin)")
    return ml.job_dir(tmp_path)


def test_third_line_with_rank_0s_nic_name(ssh_cluster, job):
    """The line as the issue writes it, with a NIC name: rank 0's host has it (the store listens
    there); the other host names its NIC differently and listens where its route to rank 0 leads."""
    h1, h2 = ssh_cluster.hosts
    assert h1.nic != h2.nic
    line = ml.LINE3.format(h1=h1.address, h2=h2.address, iface=h1.nic)
    rc, out, left = ml.run(line, job, _env(ssh_cluster), timeout=240)
    assert rc == 0 and not left, out[-4000:]
    found = ml.reports(out)
    assert ml.layout(found) == [(0, 2, 0, 1, 0, 2, [3.0] * 4), (1, 2, 0, 1, 1, 2, [3.0] * 4)], out[-4000:]
    assert ssh_cluster.wait_clean(10.0) == {}


def test_third_line_across_two_hosts_matches_appliance_launch(ssh_cluster, job):
    """The line with the hosts' subnet as the interface (OpenMPI takes a CIDR as well as a name)."""
    h1, h2 = ssh_cluster.hosts
    line = ml.LINE3.format(h1=h1.address, h2=h2.address, iface=f"{ssh_cluster.c.net}.0/24")
    rc, out, left = ml.run(line, job, _env(ssh_cluster), timeout=240)
    assert rc == 0 and not left, out[-4000:]
    found = ml.reports(out)
    assert sorted(found) == [0, 1] and all(r["same_weights"] for r in found.values()), out[-4000:]
    assert ml.layout(found) == [(0, 2, 0, 1, 0, 2, [3.0] * 4), (1, 2, 0, 1, 1, 2, [3.0] * 4)]
    assert [r["nccl_debug"] for r in found.values()] == ["INFO", "INFO"]  # -x NCCL_DEBUG=INFO reached both
    assert ssh_cluster.wait_clean(10.0) == {}
    launch = (f"{sys.executable} -m appliance launch -np 2 -H {h1.address}:1,{h2.address}:1 --ssh-port {PORT} "
              "python train.py")
    rc, out, left = ml.run(launch, job, {**_env(ssh_cluster), **ssh_cluster.env()}, timeout=240)
    assert rc == 0 and not left, out[-4000:]
    assert ml.layout(ml.reports(out)) == ml.layout(found)


def test_a_rank_that_cannot_reach_rank_0s_interface_is_one_line(ssh_cluster, job):
    """btl_tcp_if_include lo: rank 0 offers its store on 127.0.0.1, which host 2 cannot reach."""
    h1, h2 = ssh_cluster.hosts
    line = (f"mpirun -np 2 -H {h1.address}:1,{h2.address}:1 -bind-to none -x PATH -x HOROVOD_START_TIMEOUT=8 "
            "-mca btl_tcp_if_include lo python train.py")
    rc, out, left = ml.run(line, job, _env(ssh_cluster), timeout=120)
    assert rc != 0 and not left, out[-4000:]
    lines = [ln for ln in out.splitlines() if "cannot reach rank 0's store" in ln]
    assert lines, out[-4000:]
    assert f"rank 1 on {h2.hostname}" in lines[0] and f"rank 0 on {h1.hostname}" in lines[0], lines[0]
    assert "interface lo, from btl_tcp_if_include" in lines[0], lines[0]
    print("\n" + lines[0])
    assert ssh_cluster.wait_clean(10.0) == {}
