"""The re-enactment lays out what the MPI Operator v0.8.2 and Trainer v2 controllers give a job
(/work/shared/k8s/README.md 1.2-1.5, 2.2), byte for byte: the hostfile in both dialects,
discover_hosts.sh (Running workers only, sorted, launcher first with runLauncherAsWorker, no slots),
the launcher's environment, the Secret's modes, the kubelet-style atomic update of a volume, and
volumes as a cluster gives them (an emptyDir each pod's own, a ReadWriteMany claim one for all).
No engine needed: these check the harness the scenarios stand on (pure logic, files only).
"""
from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from fixtures import ROOT
from fixtures.k8s import AtomicDir, MPIJob, Pod, one_of_kind
from fixtures.k8s_trainer import TrainJob
from fixtures.k8s_volumes import Volumes

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


def test_an_emptydir_is_each_pods_own_and_a_readwritemany_claim_is_one_for_all(tmp_path):
    tpl = {"spec": {"containers": [{"volumeMounts": [{"name": "share", "mountPath": "/mnt/share"},
                                                     {"name": "dshm", "mountPath": "/dev/shm"}]}],
                    "volumes": [{"name": "share", "emptyDir": {}},
                                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]}}
    vols = Volumes(tmp_path, "MPIJob pi", [])
    a, a_tmpfs = vols.mounts("pi-worker-0", tpl)
    b, _ = vols.mounts("pi-worker-1", tpl)
    again, _ = vols.mounts("pi-worker-0", tpl)  # the pod re-created under its name: a new, empty one
    assert len({*a, *b, *again}) == 3 and all(v == {"bind": "/mnt/share", "mode": "rw"} for v in a.values())
    assert a_tmpfs == {"/dev/shm": f"mode=1777,size={8 << 30}"}  # memory: a tmpfs of the pod's own, not a bind
    assert vols.dirs("share") == [Path(p) for p in (*a, *b, *again)] and vols.of("pi-worker-0", "share") == Path(*again)
    claim = {"metadata": {"name": "ckpt"}, "spec": {"accessModes": ["ReadWriteMany"]}}
    rwx = {"spec": {"containers": [{"volumeMounts": [{"name": "share", "mountPath": "/mnt/share"}]}],
                    "volumes": [{"name": "share", "persistentVolumeClaim": {"claimName": "ckpt"}}]}}
    vols = Volumes(tmp_path / "2", "MPIJob pi", [claim])
    (tmp_path / "2").mkdir()
    assert vols.mounts("pi-launcher", rwx)[0] == vols.mounts("pi-worker-0", rwx)[0]  # one directory for both
    assert vols.dirs("share") == [vols.of("pi-worker-0", "share")] == [vols.of("pi-launcher", "share")]
    rwo = {"metadata": {"name": "ckpt"}, "spec": {"accessModes": ["ReadWriteOnce"]}}
    with pytest.raises(ValueError, match="'ckpt' is \\['ReadWriteOnce'\\]: only ReadWriteMany"):
        Volumes(tmp_path, "MPIJob pi", [rwo]).mounts("pi-worker-0", rwx)
    with pytest.raises(ValueError, match="'ckpt': no such claim given to the job"):
        Volumes(tmp_path, "MPIJob pi", []).mounts("pi-worker-0", rwx)
    host = {"spec": {"containers": [{"volumeMounts": [{"name": "h", "mountPath": "/h"}]}],
                     "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}}
    with pytest.raises(ValueError, match="volume 'h': only emptyDir and persistentVolumeClaim"):
        Volumes(tmp_path, "MPIJob pi", []).mounts("pi-worker-0", host)


@pytest.mark.parametrize("manifest", sorted(p.name for p in DEPLOY.glob("mpijob-*.yaml")) + ["trainjob.yaml"])
def test_every_shipped_manifest_maps_under_per_pod_volumes(tmp_path, manifest):
    """Every pod of every shipped job gets its volumes as a cluster gives them (nothing refused),
    and no two pods share an emptyDir."""
    if manifest == "trainjob.yaml":
        job = TrainJob(None, "img", DEPLOY / manifest, DEPLOY / "trainer-runtime.yaml")
        pods = [job.launcher_pod_name()] + [job.node_pod_name(i) for i in range(job.nodes)]
    else:
        job = MPIJob(None, "img", DEPLOY / manifest)
        pods = [job.launcher_pod_name()] + [job.worker_pod_name(i) for i in range(job.replicas)]
    vols = Volumes(tmp_path, f"{job.kind} {job.name}", job.claims)
    seen: list[str] = []
    for pod in pods:
        binds, _ = vols.mounts(pod, job.launcher_template() if pod == pods[0] else job.worker_template())
        seen += list(binds)
    assert len(seen) == len(set(seen)), seen
