"""The shipped elastic MPIJob (deploy/kubernetes/mpijob-elastic.yaml) started at one worker pod,
grown to two, then three, scaled down to one and up to two again (1-2-3-1-2), re-enacted with Docker (tests/fixtures/k8s.py): the most common elastic
start on a cluster. The manifest runs as written except ``-np 1`` (the job's first size) and the
program: tests/ranks/elastic_grow.py, a Horovod elastic script as Horovod's examples write it
(``import horovod.torch as hvd``, ``DistributedOptimizer`` built once before ``hvd.elastic.run``,
at size 1 here), every step allgathering the sum of the parameters and failing if the ranks differ.

Effects asserted: steps at each size within a bound after the replicas change (a job that hangs after
the growth fails here, not in minutes); the launcher's exit code; every rank ends with the same
parameters, equal to the same training replayed in one process from the sizes its steps ran at;
no rank program left on a worker, no container left.
"""
from __future__ import annotations

import importlib.util
import json
import time

import pytest
import torch

from fixtures import RANKS, ROOT
from fixtures.k8s import MPIJob

pytestmark = [pytest.mark.k8s, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(420, func_only=True)]

MANIFEST = ROOT / "deploy" / "kubernetes" / "mpijob-elastic.yaml"
CAP = 5000  # the program's step cap: the test ends the job with a `stop` file


def program():
    spec = importlib.util.spec_from_file_location("elastic_grow", RANKS / "elastic_grow.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def steps(job) -> list[dict]:
    """Every step line (``log.W``) the workers wrote in their pods' own /mnt/share."""
    out = []
    for d in job.volume_dirs("share"):
        for f in d.glob("log.*"):
            for line in f.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line being written
    return out


def wait_steps(job, size: int, n: int, timeout: float, after: int = -1) -> int:
    """Waits for ``n`` steps at ``size`` past step ``after``; returns the newest step seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = steps(job)
        if len({s["step"] for s in seen if s["size"] == size and s["step"] > after}) >= n:
            return max(s["step"] for s in seen)
        job.launcher.container_obj.reload()
        if job.launcher.container_obj.status == "exited":
            break
        time.sleep(0.2)
    pytest.fail(f"not {n} steps at size {size} within {timeout} s (a hang after the growth?)\n{job.all_logs()}")


def test_an_elastic_job_started_at_one_pod_goes_through_1_2_3_1_2_pods(k8s_jobs):
    job = k8s_jobs(MPIJob, MANIFEST, mounts={str(RANKS): "/k8s-ranks"})
    job.replicas = 1
    args = list(job.launcher_template()["spec"]["containers"][0]["args"])
    args = args[:args.index("python")]
    args[args.index("-np") + 1] = "1"
    job.override = (None, [*args, "python", "/k8s-ranks/elastic_grow.py", "/mnt/share", str(CAP), "0.1", "check"])
    job.start()
    last = wait_steps(job, 1, 3, 120)
    for size in (2, 3, 1, 2):
        removing = job.scale(size)
        if removing is not None:
            removing.join(120)  # the removed pods deleted (preStop hook, SIGTERM) before the next change
        last = wait_steps(job, size, 5, 180, after=last)
    for d in job.volume_dirs("share"):  # every pod reads its own /mnt/share
        (d / ".stop.tmp").write_text(str(last + 5))
        (d / ".stop.tmp").rename(d / "stop")
    rc, out = job.wait_launcher(240)
    assert rc == 0, job.all_logs()
    done = [json.loads(f.read_text()) for d in job.volume_dirs("share") for f in d.glob("done.*")]
    assert sorted(d["rank"] for d in done) == [0, 1], out[-3000:]
    sizes = done[0]["sizes"]
    runs = [n for i, n in enumerate(sizes) if i == 0 or sizes[i - 1] != n]  # the sizes in the order they ran
    # 3 -> 1 may pass through 2: the two pods are deleted (preStop, SIGTERM) one after the other
    assert runs[:3] == [1, 2, 3] and runs[-2:] == [1, 2] and set(runs[3:-2]) <= {2}, runs
    replayed = [p.detach().flatten() for p in program().replay(sizes).parameters()]
    for d in done:  # one model on every rank: the training replayed from the sizes its steps ran at
        assert d["sizes"] == sizes, (d["rank"], d["sizes"], sizes)
        for got, want in zip(d["params"], replayed):
            assert torch.allclose(torch.tensor(got), want, rtol=1e-4, atol=1e-5), (d["rank"], got[:4], want[:4].tolist())
    for pod in job.workers.values():
        assert job.job_processes(pod) == [], pod.name
    job.close()
    assert job.leftovers() == [] and not job.tmp.exists()
