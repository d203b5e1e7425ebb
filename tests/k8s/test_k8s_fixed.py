"""The shipped fixed-size MPIJobs run as written (deploy/kubernetes/, re-enacted with Docker by
tests/fixtures/k8s.py: pods as containers with the operator's names, files, modes, env and uid),
the GPU one included, on these GPU-less machines (its ranks train on the CPU).

Effects asserted for each: the launcher's exit code, the training record rank 0 left in its own
pod's /mnt/share (an emptyDir, each pod's own: every epoch of the job, none lost), no rank program
left on a worker, no container left.
"""
from __future__ import annotations

import copy
import json

import pytest

from fixtures import ROOT
from fixtures.k8s import MPIJob, one_of_kind

pytestmark = [pytest.mark.k8s, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(420, func_only=True)]

DEPLOY = ROOT / "deploy" / "kubernetes"


def epochs_recorded(job, pod: str) -> list[int]:
    """The epochs in the record rank 0 left in its pod's own /mnt/share (an emptyDir: no other pod
    sees it, and no other pod has one)."""
    found = [d for d in job.volume_dirs("share") if (d / "models" / "digits" / "metrics.json").exists()]
    assert found == [job.volume_of(pod, "share")], (found, pod)
    metrics = json.loads((found[0] / "models" / "digits" / "metrics.json").read_text())
    return [e["epoch"] for e in metrics["epochs"]]


def run_fixed(k8s_jobs, manifest: str, epochs: int = 8, rank0: str = "worker-0", **kw):
    """Run a shipped MPIJob (with ``epochs`` instead of the manifest's 8, when given less) to its end."""
    m = one_of_kind(DEPLOY / manifest, "MPIJob")
    args = m["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
    if "--epochs" not in args:
        args += ["--epochs", "8"]  # the default job's default, written out
    assert args[args.index("--epochs") + 1] == "8"
    args[args.index("--epochs") + 1] = str(epochs)
    job = k8s_jobs(MPIJob, m, **kw)
    job.start()
    rc, out = job.wait_launcher(300)
    assert rc == 0, job.all_logs()
    assert epochs_recorded(job, f"{job.name}-{rank0}") == list(range(1, epochs + 1)), out[-3000:]
    for pod in job.workers.values():
        assert job.job_processes(pod) == [], pod.name
    job.close()
    assert job.leftovers() == [] and not job.tmp.exists()  # containers, network, host dirs gone
    return out


def test_mpirun_mpijob_trains_as_written(k8s_jobs):
    out = run_fixed(k8s_jobs, "mpijob-mpirun.yaml")
    hosts = [ln for ln in out.splitlines() if "devices: " in ln]  # mpirun: bare; horovodrun: [0]<stdout>: first
    assert hosts and "appliance-mpirun-worker-0" in hosts[0] and "appliance-mpirun-worker-1" in hosts[0], out[-3000:]



def as_root(manifest: dict) -> dict:
    """The operator's defaults instead of mpiuser: no runAsUser, the Secret at /root/.ssh (mode 0600),
    and workers without a command (the operator gives them `/usr/sbin/sshd -De`)."""
    manifest = copy.deepcopy(manifest)
    manifest["spec"].pop("sshAuthMountPath", None)
    for role in ("Launcher", "Worker"):
        c = manifest["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"][0]
        c.pop("securityContext", None)
        if role == "Worker":
            c.pop("command", None)
            c.pop("args", None)
    return manifest


# The line in one write(2): mpirun merges the ranks' stdout as it comes, and print() under
# PYTHONUNBUFFERED writes the text and its newline apart.
ALLREDUCE = ("import os, numpy as np, appliance.runtime as rt; rt.init(); r = rt.allreduce(np.ones(2), op=rt.Sum, "
             "name='k8s'); os.write(1, f'ALLREDUCE {rt.rank()} {rt.size()} {r.tolist()}\\n'.encode()); rt.shutdown()")


@pytest.mark.parametrize("manifest", ["mpijob-mpirun.yaml", "mpijob-horovodrun.yaml"])
def test_mpijob_as_root_with_the_operators_defaults(k8s_jobs, manifest):
    """The launcher's command as written, as root; the program a numpy allreduce (the training as
    written is the mpiuser tests'), on 2 workers x 2 slots."""
    m = as_root(one_of_kind(DEPLOY / manifest, "MPIJob"))
    args = m["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
    m["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"] = \
        [*args[:args.index("python")], "python", "-c", ALLREDUCE]
    job = k8s_jobs(MPIJob, m)
    assert job.secret_modes()["id_rsa"] == 0o600
    job.start()
    rc, out = job.wait_launcher(300)
    assert rc == 0, job.all_logs()
    lines = sorted(ln[ln.index("ALLREDUCE"):] for ln in out.splitlines() if "ALLREDUCE" in ln)
    assert lines == [f"ALLREDUCE {r} 4 [4.0, 4.0]" for r in range(4)], out[-3000:]
    for pod in job.workers.values():
        assert job.job_processes(pod) == [], pod.name
    job.close()
    assert job.leftovers() == [] and not job.tmp.exists()  # containers, network, host dirs gone


@pytest.mark.parametrize("root", [False, True], ids=["mpiuser", "root"])
def test_the_images_environment_reaches_ssh_sessions(k8s_jobs, root):
    """A non-interactive SSH session on a worker (how mpirun's orted and the launcher's ranks start)
    sees the image's ENV: mpiuser's sshd through SetEnv, root's through PAM's /etc/environment."""
    manifest = one_of_kind(DEPLOY / "mpijob-mpirun.yaml", "MPIJob")
    worker = "appliance-mpirun-worker-1.appliance-mpirun.default.svc"
    script = "id -un; env; python -c 'import appliance.runtime._core, torch; print(\"imports ok\")'"
    job = k8s_jobs(MPIJob, as_root(manifest) if root else manifest, launcher_command=["ssh"],
                   launcher_args=[worker, script])
    job.start()
    rc, out = job.wait_launcher(120)
    assert rc == 0, job.all_logs()
    lines = out.splitlines()
    assert lines[0] == ("root" if root else "mpiuser"), out
    env = dict(ln.split("=", 1) for ln in lines[1:] if "=" in ln)
    assert env["PATH"].split(":")[0] == "/opt/venv/bin", out
    assert env["PYTHONUNBUFFERED"] == "1" and env["LANG"] == "C.UTF-8"
    assert env["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"
    assert "APPLIANCE_SSH_PORT" not in env  # the appliance's port, not Kubernetes' (2222 from ssh_config)
    assert "imports ok" in out


def test_horovodrun_mpijob_trains_as_written(k8s_jobs):
    out = run_fixed(k8s_jobs, "mpijob-horovodrun.yaml")
    hosts = [ln for ln in out.splitlines() if "devices: " in ln]  # mpirun: bare; horovodrun: [0]<stdout>: first
    assert hosts and "appliance-horovodrun-worker-0" in hosts[0] and "appliance-horovodrun-worker-1" in hosts[0], out[-3000:]


def test_launcher_as_worker_mpijob_trains_as_written(k8s_jobs):
    out = run_fixed(k8s_jobs, "mpijob-launcher-as-worker.yaml", epochs=2, rank0="launcher")  # the launcher trains too
    hosts = [ln for ln in out.splitlines() if "devices: " in ln]  # mpirun: bare; horovodrun: [0]<stdout>: first
    assert hosts and all(f"appliance-launcher-worker-{p}" in hosts[0] for p in ("launcher", "worker-0", "worker-1")), out[-3000:]


def test_gpu_mpijob_runs_as_written_on_nodes_without_gpus(k8s_jobs):
    """mpijob-gpu.yaml (2 workers x 4 slots: 8 ranks, /dev/shm a memory emptyDir) with 1 epoch, on
    these GPU-less machines: `--device auto` trains on the CPU, one rank per slot. Which GPU each rank
    takes is the GPU tier's (tests/gpu); the nvidia.com/gpu limits are the scheduler's."""
    out = run_fixed(k8s_jobs, "mpijob-gpu.yaml", epochs=1)
    devices = next(ln for ln in out.splitlines() if "devices: " in ln)
    for p in range(2):
        assert devices.count(f"@appliance-gpu-worker-{p}") == 4, devices
    assert "rank 7 " in devices and "rank 8 " not in devices, devices


def test_launcher_as_worker_with_a_readwritemany_claim_shares_one_directory(k8s_jobs):
    """mpijob-launcher-as-worker.yaml with what docs/kubernetes.md says for one share: a
    ReadWriteMany claim at /mnt/share in both templates, and `--shared /mnt/share` so the launcher
    insists on it. The preflight finds it shared (rank 0's record lands in the claim's directory,
    which every pod sees)."""
    m = one_of_kind(DEPLOY / "mpijob-launcher-as-worker.yaml", "MPIJob")
    for role in ("Launcher", "Worker"):
        m["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["volumes"] = [
            {"name": "share", "persistentVolumeClaim": {"claimName": "appliance-share"}}]
    c = m["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    c["args"] = ["--shared", "/mnt/share", "--verbose", *c["args"][:-1], "1"]  # 1 epoch
    claim = {"metadata": {"name": "appliance-share"}, "spec": {"accessModes": ["ReadWriteMany"]}}
    job = k8s_jobs(MPIJob, m, claims=[claim])
    job.start()
    rc, out = job.wait_launcher(300)
    assert rc == 0, job.all_logs()
    assert "its pod's own" not in out and "not the primary's" not in out, out[-3000:]
    (share,) = job.volume_dirs("share")
    assert share == job.volume_of(job.launcher_pod_name(), "share") == job.volume_of(job.worker_pod_name(1), "share")
    metrics = json.loads((share / "models" / "digits" / "metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1], out[-3000:]
    job.close()
    assert job.leftovers() == [] and not job.tmp.exists()
