"""The shipped elastic MPIJob (deploy/kubernetes/mpijob-elastic.yaml: horovodrun over the operator's
/etc/mpi/discover_hosts.sh), re-enacted with Docker, through what a cluster does to its pods:
scale-up, scale-down, a crashed worker re-created under the same name, a listed worker whose sshd
is late. The manifest runs as written except the program: tests/ranks/elastic_steps.py (numpy, starts
in well under a second; its committed state records the job size of every step), mounted read-only.

Effects asserted for each: the launcher's exit code; the record the ranks leave on the shared
volume: every step of the job committed exactly once (``sizes`` has one entry per step and ``w`` is
their sum: no committed step lost, none counted twice) and the sizes the job ran at; no rank program
left on a worker; no container left. The lags (a worker appearing in discover_hosts.sh to its first
step; replicas lowered to the survivors' first step) are printed for the report.
"""
from __future__ import annotations

import json
import time

import pytest

from fixtures import RANKS, ROOT
from fixtures.k8s import MPIJob

pytestmark = [pytest.mark.k8s, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]

MANIFEST = ROOT / "deploy" / "kubernetes" / "mpijob-elastic.yaml"
STEP_S = 0.1


def elastic_job(k8s_jobs, steps: int, *, replicas: int = 2, np_: int = 2, commit: int = 2, **kw) -> MPIJob:
    job = k8s_jobs(MPIJob, MANIFEST, mounts={str(RANKS): "/k8s-ranks"}, **kw)
    job.replicas = replicas
    args = list(job.launcher_template()["spec"]["containers"][0]["args"])
    args = args[:args.index("python")]
    args[args.index("-np") + 1] = str(np_)
    job.override = (None, [*args, "python", "/k8s-ranks/elastic_steps.py", "/mnt/share", str(steps), str(commit), str(STEP_S)])
    return job


def steps_at(job, size: int) -> float | None:
    """The time of the first step any worker took at ``size`` (from the workers' step files)."""
    firsts = []
    for f in job.volumes["share"].glob("step.*"):
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if rec["size"] == size:
            firsts.append(rec["t"] - STEP_S * 0)  # rewritten every step: the earliest seen
    return min(firsts) if firsts else None


def wait_for(what: str, cond, job, timeout: float = 90, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        if job.launcher.container_obj.status == "exited":
            break
        time.sleep(poll)
        job.launcher.container_obj.reload()
    pytest.fail(f"{what}: not within {timeout} s\n{job.all_logs()}")


class FirstStep:
    """Polls the step files for the first step at a size (a file is rewritten every step)."""

    def __init__(self, job, size: int):
        self.job, self.size, self.first = job, size, None

    def __call__(self):
        t = steps_at(self.job, self.size)
        if t is not None and (self.first is None or t < self.first):
            self.first = t
        return self.first


def finish(job, steps: int, timeout: float = 240) -> list[dict]:
    rc, out = job.wait_launcher(timeout)
    assert rc == 0, job.all_logs()
    done = [json.loads(f.read_text()) for f in sorted(job.volumes["share"].glob("done.*"))]
    assert done, out[-3000:]
    for d in done:  # every rank ends with the same committed state
        assert d["step"] == steps and len(d["sizes"]) == steps, d
        assert d["w"] == [float(sum(d["sizes"]))] * 4, d
    for pod in job.workers.values():
        assert job.job_processes(pod) == [], pod.name
    job.close()
    assert job.leftovers() == []
    return done


def started(job):
    job.start()
    wait_for("the first step", lambda: steps_at(job, 2), job)


def test_scale_up_a_worker_added_to_discover_hosts_joins(k8s_jobs):
    job = elastic_job(k8s_jobs, steps=120)
    started(job)
    job.scale(3)
    first = FirstStep(job, 3)
    wait_for("a step at size 3", first, job)
    listed = next(t for t, hosts in job.discovery_log if len(hosts) == 3)
    print(f"\n[k8s] scale-up: listed in discover_hosts.sh -> first step at size 3: {first.first - listed:.2f} s")
    done = finish(job, 120)
    assert 3 in done[0]["sizes"] and done[0]["sizes"][0] == 2


def test_scale_down_the_removed_worker_leaves_gracefully(k8s_jobs):
    job = elastic_job(k8s_jobs, steps=120, replicas=3, np_=3)
    job.start()
    wait_for("the first step at size 3", lambda: steps_at(job, 3), job)
    lowered = time.time()
    stopper = job.scale(2)
    first = FirstStep(job, 2)
    wait_for("a step at size 2", first, job)
    print(f"\n[k8s] scale-down: replicas lowered -> survivors' first step at size 2: {first.first - lowered:.2f} s")
    stopper.join(60)
    log = job.logs(job.launcher)
    done = finish(job, 120)
    assert done[0]["sizes"][-1] == 2


def test_workers_started_after_the_launcher_are_waited_for(k8s_jobs):
    job = elastic_job(k8s_jobs, steps=60)
    job.start(workers=False)  # launcherCreationPolicy AtStartup: the launcher may come first
    time.sleep(5)
    for i in range(2):
        job.start_worker(i)
    done = finish(job, 60)
    assert set(done[0]["sizes"]) == {2}


def test_the_launchers_dns_name_missing_does_not_matter(k8s_jobs):
    job = elastic_job(k8s_jobs, steps=60, launcher_dns=False)
    started(job)
    probe = job.workers[0].container_obj.exec_run(["getent", "hosts", job.host_name(job.launcher_pod_name())])
    assert probe.exit_code != 0, probe.output  # the workers cannot resolve the launcher
    done = finish(job, 60)
    assert set(done[0]["sizes"]) == {2}
