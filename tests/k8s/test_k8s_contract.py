"""The re-enactment lays out what the MPI Operator v0.8.2 and Trainer v2 controllers give a job
(/work/shared/k8s/README.md 1.2-1.5, 2.2), byte for byte: the hostfile in both dialects,
discover_hosts.sh (Running workers only, sorted, launcher first with runLauncherAsWorker, no slots),
the launcher's environment, the Secret's modes, and the kubelet-style atomic update of a volume.
No engine needed: these check the harness the scenarios stand on (pure logic, files only).
"""
from __future__ import annotations

import os
import subprocess
import threading

import pytest

from fixtures import ROOT
from fixtures.k8s import AtomicDir, MPIJob, Pod, one_of_kind
from fixtures.k8s_trainer import TrainJob

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(60)]

DEPLOY = ROOT / "deploy" / "kubernetes"


def mpijob(**spec) -> MPIJob:
    m = one_of_kind(DEPLOY / "mpijob-mpirun.yaml", "MPIJob")
    m["metadata"]["name"] = "pi"
    m["spec"].update(spec)
    return MPIJob(None, "img", m)


def running(job: MPIJob, *indexes: int) -> None:
    for i in indexes:
        job.workers[i] = Pod(job.worker_pod_name(i), "worker", i, {}, {}, running=True)


def test_openmpi_hostfile_lists_every_replica_with_slots():
    job = mpijob(slotsPerWorker=2)
    assert job.hostfile() == "pi-worker-0.pi.default.svc slots=2\npi-worker-1.pi.default.svc slots=2\n"


def test_intel_and_mpich_hostfiles_use_host_colon_slots_and_their_env():
    intel = mpijob(mpiImplementation="Intel", slotsPerWorker=3)
    assert intel.hostfile() == "pi-worker-0.pi.default.svc:3\npi-worker-1.pi.default.svc:3\n"
    assert intel.launcher_env()["I_MPI_HYDRA_HOST_FILE"] == "/etc/mpi/hostfile"
    assert intel.launcher_env()["I_MPI_PERHOST"] == "3"
    mpich = mpijob(mpiImplementation="MPICH")
    assert mpich.launcher_env()["HYDRA_HOST_FILE"] == "/etc/mpi/hostfile"
    assert not [k for k in mpich.launcher_env() if k.startswith("OMPI_")]


def test_discover_hosts_lists_running_workers_sorted_without_slots():
    job = mpijob(slotsPerWorker=2)
    job.replicas = 3
    running(job, 2, 0)
    assert job.discover_hosts() == "#!/bin/sh\necho pi-worker-0.pi.default.svc\necho pi-worker-2.pi.default.svc\n"
    job.workers[2].running = False
    assert job.discover_hosts() == "#!/bin/sh\necho pi-worker-0.pi.default.svc\n"


def test_run_launcher_as_worker_lists_the_launcher_first_and_keeps_nvidia_env():
    job = mpijob(runLauncherAsWorker=True, slotsPerWorker=1)
    running(job, 0)
    assert job.hostfile().splitlines()[0] == "pi-launcher.pi.default.svc slots=1"
    assert job.discover_hosts().splitlines()[1:] == ["echo pi-launcher.pi.default.svc", "echo pi-worker-0.pi.default.svc"]
    assert "NVIDIA_VISIBLE_DEVICES" not in job.launcher_env()
    assert mpijob().launcher_env()["NVIDIA_VISIBLE_DEVICES"] == ""


def test_launcher_env_is_the_operators():
    env = mpijob(slotsPerWorker=4).launcher_env()
    assert env == {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                   "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                   "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10", "OMPI_MCA_orte_set_default_slots": "4",
                   "NVIDIA_VISIBLE_DEVICES": "", "NVIDIA_DRIVER_CAPABILITIES": ""}


def test_secret_modes_follow_the_mount_path_and_trainer_uses_0640_with_fsgroup():
    assert set(mpijob(sshAuthMountPath="/root/.ssh").secret_modes().values()) == {0o600}
    assert set(mpijob().secret_modes().values()) == {0o644}  # /home/mpiuser/.ssh in the manifest
    tj = TrainJob(None, "img", DEPLOY / "trainjob.yaml", DEPLOY / "trainer-runtime.yaml")
    assert tj.secret_modes() == {"id_rsa": 0o640, "id_rsa.pub": 0o644, "authorized_keys": 0o644}
    assert tj.fs_group() == 1000 and tj.volume_modes() == tj.secret_modes()
    root = mpijob(sshAuthMountPath="/root/.ssh")
    root.manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["securityContext"] = {"fsGroup": 1000}
    assert root.volume_modes()["id_rsa"] == 0o640  # kubelet's fsGroup adds group read to a 0600 key
    assert "K_MPI_JOB_ROLE" not in tj.launcher_env() and not tj.has_discovery()


def test_a_volume_update_is_an_atomic_swap_of_dot_dot_data(tmp_path):
    d = AtomicDir(tmp_path / "etc-mpi", {"hostfile": 0o444, "discover_hosts.sh": 0o555})
    d.write({"hostfile": "a slots=1\n", "discover_hosts.sh": "#!/bin/sh\necho a\n"})
    first = os.readlink(d.root / "..data")
    assert os.readlink(d.root / "hostfile") == "..data/hostfile"
    assert oct(os.stat(d.root / "discover_hosts.sh").st_mode & 0o7777) == "0o555"
    assert oct(os.stat(d.root / "hostfile").st_mode & 0o7777) == "0o444"
    seen, stop = set(), threading.Event()

    def reader():  # a launcher polling the script while it is replaced: never a partial or missing file
        while not stop.is_set():
            seen.add(subprocess.run([str(d.root / "discover_hosts.sh")], capture_output=True, text=True).stdout)

    t = threading.Thread(target=reader)
    t.start()
    for i in range(20):
        d.write({"hostfile": "a slots=1\n", "discover_hosts.sh": "#!/bin/sh\necho a\n" + ("echo b\n" if i % 2 == 0 else "")})
    stop.set()
    t.join(30)
    assert seen <= {"a\n", "a\nb\n"}, seen
    assert os.readlink(d.root / "..data") != first and not (d.root / first).exists()
