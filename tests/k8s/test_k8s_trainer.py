"""The shipped Kubeflow Trainer TrainJob (deploy/kubernetes/trainjob.yaml on the ClusterTrainingRuntime
in trainer-runtime.yaml), re-enacted with Docker: nodes ``<job>-node-0-<i>`` running mpiuser's sshd,
the launcher ``<job>-launcher-0-0`` started once they are ready (JobSet's dependsOn), its
/etc/mpi/hostfile with Trainer's short names, the Secret's key at mode 0640 owned by root with the
group fsGroup (1000), and no discover_hosts.sh or K_MPI_JOB_ROLE.

The launcher runs the shipped torch job (2 epochs), then in the same pods a TensorFlow job through
the same ``horovodrun`` and hostfile (tests/ranks/tf_average.py as ``python -c``): one TrainJob
covers both frameworks' ranks on the Trainer path.

Effects asserted: the launcher's exit code, the key layout the pods saw, every epoch in rank 0's
pod's own volume, the TF ranks on the two nodes with averaged gradients and one model at the end
(``fixtures.tf_image.check_averaged``), no rank program left, no container left.
"""
from __future__ import annotations

import json
import shlex

import pytest

from fixtures import ROOT
from fixtures.k8s_trainer import TrainJob
from fixtures.tf_image import JOB, check_averaged, reports

pytestmark = [pytest.mark.k8s, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(420, func_only=True)]

DEPLOY = ROOT / "deploy" / "kubernetes"


def test_trainjob_trains_with_trainers_hostfile_and_key_modes(k8s_jobs):
    job = k8s_jobs(TrainJob, DEPLOY / "trainjob.yaml", DEPLOY / "trainer-runtime.yaml")
    args = job.trainer["args"]
    args[args.index("--epochs") + 1] = "2"  # as written but 2 epochs: the tier's time goes to the MPIJobs
    # Then, in the same pods, a TensorFlow job through the same launcher and hostfile (one TrainJob for
    # both frameworks: another costs a minute of pods starting)
    tf_job = ["horovodrun", "-np", "2", "python", "-c", JOB.read_text()]
    job.trainer["command"] = ["sh", "-c", f"{shlex.join(job.trainer['command'] + args)} && {shlex.join(tf_job)}"]
    del job.trainer["args"]
    job.trainer["env"] = [*job.trainer.get("env", []), {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "3"}]
    assert job.hostfile() == "".join(f"appliance-train-node-0-{i}.appliance-train slots=1\n" for i in range(2))
    job.start()
    rc, out = job.wait_launcher(300)
    assert rc == 0, job.all_logs()
    reps = reports(out)
    check_averaged(reps, out)
    assert sorted(rep["host"] for rep in reps.values()) == [f"appliance-train-node-0-{i}" for i in range(2)], reps
    node = job.workers[0].container_obj
    seen = node.exec_run(["stat", "-L", "-c", "%a %u %g %n", "/home/mpiuser/.ssh/id_rsa", "/home/mpiuser/.ssh/authorized_keys"],
                         user="1000").output.decode()
    assert seen.split("\n")[:2] == ["640 0 1000 /home/mpiuser/.ssh/id_rsa", "644 0 1000 /home/mpiuser/.ssh/authorized_keys"]
    found = [d for d in job.volume_dirs("share") if (d / "models" / "digits" / "metrics.json").exists()]
    assert found == [job.volume_of("appliance-train-node-0-0", "share")], found  # rank 0's pod, its own emptyDir
    metrics = json.loads((found[0] / "models" / "digits" / "metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2], out[-3000:]
    for pod in job.workers.values():
        assert job.job_processes(pod) == [], pod.name
    job.close()
    assert job.leftovers() == [] and not job.tmp.exists()  # containers, network, host dirs gone
