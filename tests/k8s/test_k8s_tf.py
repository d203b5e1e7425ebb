"""A TensorFlow MPIJob: the shipped ``deploy/kubernetes/mpijob-mpirun.yaml`` with its ranks running
tests/ranks/tf_average.py instead of the default job (``python -c`` with the file's text, as the
image has no TensorFlow example of its own), 2 worker pods with one slot each, re-enacted with
Docker (tests/fixtures/k8s.py). The ranks are mpirun's, started over ssh as mpiuser (uid 1000),
bootstrapping through PMIx, and load the image's op library (read-only for them).

Effects asserted: the launcher's exit code, one rank on each worker pod as uid 1000, averaged
gradients and one model at the end (``fixtures.tf_image.check_averaged``), no rank program left
on a worker, no container left. Bounded by ``wait_launcher``.
"""
from __future__ import annotations

import pytest

from fixtures import ROOT
from fixtures.k8s import MPIJob, one_of_kind
from fixtures.tf_image import JOB, check_averaged, reports

pytestmark = [pytest.mark.k8s, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(420, func_only=True)]


def test_a_tensorflow_mpijob_averages_under_mpirun(k8s_jobs):
    m = one_of_kind(ROOT / "deploy" / "kubernetes" / "mpijob-mpirun.yaml", "MPIJob")
    m["spec"]["slotsPerWorker"] = 1
    launcher = m["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    args = launcher["args"]
    assert args[:2] == ["-np", "4"] and "python" in args, args
    launcher["args"] = ["-np", "2", *args[2:args.index("python")], "-x", "TF_CPP_MIN_LOG_LEVEL=3",
                        "python", "-c", JOB.read_text()]
    job = k8s_jobs(MPIJob, m)
    job.start()
    rc, out = job.wait_launcher(300)
    assert rc == 0, job.all_logs()
    reps = reports(out)
    check_averaged(reps, out)
    assert sorted(rep["host"] for rep in reps.values()) == [f"{job.name}-worker-0", f"{job.name}-worker-1"], reps
    assert [rep["uid"] for rep in reps.values()] == [1000, 1000], reps
    for pod in job.workers.values():
        assert job.job_processes(pod) == [], pod.name
    job.close()
    assert job.leftovers() == [] and not job.tmp.exists()
