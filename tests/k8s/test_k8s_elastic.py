"""The shipped elastic MPIJob (deploy/kubernetes/mpijob-elastic.yaml: horovodrun over the operator's
/etc/mpi/discover_hosts.sh), re-enacted with Docker, through what a cluster does to its pods:
scale-up, scale-down, a crashed worker re-created under the same name, a listed worker whose sshd
is late. The manifest runs as written except the program: tests/ranks/elastic_steps.py (numpy, starts
in well under a second; its committed state records the job size of every step), mounted read-only.

Effects asserted for each: the launcher's exit code; the record the ranks leave in their pods'
own /mnt/share (an emptyDir each; the test reads every pod's): every step of the job committed exactly once (``sizes`` has one entry per step and ``w`` is
their sum: no committed step lost, none counted twice) and the sizes the job ran at; no rank program
left on a worker; no container left. The lags (a worker appearing in discover_hosts.sh to its first
step; replicas lowered to the survivors' first step) are printed; their medians are in
docs/kubernetes.md (scale-up and scale-down[deleted-while-listed], 5 runs each).
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
COMMIT = 2  # elastic_steps.py commits every COMMIT steps


# The crash tests' cool-down: the Kubernetes default (10 s, doubling; COOLDOWN_S) is the launcher's
# own, asserted end to end by tests/launcher/ssh/test_k8s_ssh.py (and its detection by
# tests/launcher/test_kubernetes.py); here the flag shortens it so that the rejoin comes in a second.
SHORT_COOLDOWN = ["--blacklist-cooldown-range", "1", "1"]


def elastic_job(k8s_jobs, steps: int, *, replicas: int = 2, np_: int = 2, commit: int = COMMIT,
                flags: tuple[str, ...] = (), **kw) -> MPIJob:
    job = k8s_jobs(MPIJob, MANIFEST, mounts={str(RANKS): "/k8s-ranks"}, **kw)
    job.replicas = replicas
    args = list(job.launcher_template()["spec"]["containers"][0]["args"])
    args = args[:args.index("python")]
    args[args.index("-np") + 1] = str(np_)
    job.override = (None, [*args, *flags, "python", "/k8s-ranks/elastic_steps.py", "/mnt/share", str(steps), str(commit),
                           str(STEP_S)])
    return job


def records(job, pattern: str):
    """The files elastic_steps.py wrote in every pod's own /mnt/share (an emptyDir each)."""
    return [f for d in job.volume_dirs("share") for f in d.glob(pattern)]


def switch(job, name: str, value) -> None:
    """A switch file for elastic_steps.py, put in every pod's /mnt/share (each reads its own)."""
    for d in job.volume_dirs("share"):
        (d / f".{name}.tmp").write_text(str(value))
        (d / f".{name}.tmp").rename(d / name)


def step_records(job):
    """The workers' step files as read now (each holds its worker's last step); a file caught
    mid-write is skipped."""
    for f in records(job, "step.*"):
        try:
            yield json.loads(f.read_text())
        except (OSError, ValueError):
            continue


def steps_at(job, size: int, after: float = 0.0) -> float | None:
    """The earliest time in the workers' step files (each holds its worker's last step) of a step
    at ``size`` taken after ``after``, or None."""
    firsts = [rec["t"] for rec in step_records(job) if rec["size"] == size and rec["t"] > after]
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


def steps_past(job, size: int, step: int) -> bool:
    """Whether a worker's step file shows a step at ``size`` past ``step``."""
    return any(rec["size"] == size and rec["step"] > step for rec in step_records(job))


class FirstStep:
    """Polls the step files for the first step at a size taken after ``after`` (a file is rewritten
    every step, so this is the first one seen: late by at most a poll and a step)."""

    def __init__(self, job, size: int, after: float = 0.0):
        self.job, self.size, self.after, self.first = job, size, after, None

    def __call__(self):
        t = steps_at(self.job, self.size, self.after)
        if t is not None and (self.first is None or t < self.first):
            self.first = t
        return self.first


def stop_soon(job, extra: int = 20) -> int:
    """End the job ``extra`` steps from now (elastic_steps.py's ``stop`` file): the step it ends at."""
    steps = [json.loads(f.read_text())["step"] for f in records(job, "step.*")]
    stop = max(steps) + extra
    switch(job, "stop", stop)
    return stop


def finish(job, steps: int, timeout: float = 240) -> list[dict]:
    rc, out = job.wait_launcher(timeout)
    assert rc == 0, job.all_logs()
    done = [json.loads(f.read_text()) for f in sorted(records(job, "done.*"), key=lambda f: f.name)]
    assert done, out[-3000:]
    for d in done:  # every rank ends with the same committed state
        assert d["step"] == steps and len(d["sizes"]) == steps, d
        assert d["w"] == [float(sum(d["sizes"]))] * 4, d
    for pod in job.workers.values():
        assert job.job_processes(pod) == [], pod.name
    job.close()
    assert job.leftovers() == [] and not job.tmp.exists()  # containers, network, host dirs gone
    return done


def started(job):
    job.start()
    wait_for("the first step", lambda: steps_at(job, 2), job)


def test_scale_up_a_worker_added_to_discover_hosts_joins(k8s_jobs):
    job = elastic_job(k8s_jobs, steps=5000)  # ended by stop_soon once it trained at size 3
    started(job)
    job.scale(3)
    first = FirstStep(job, 3)
    wait_for("a step at size 3", first, job)
    listed = next(t for t, hosts in job.discovery_log if len(hosts) == 3)
    print(f"\n[k8s] scale-up: listed in discover_hosts.sh -> first step at size 3: {first.first - listed:.2f} s")
    done = finish(job, stop_soon(job))
    assert 3 in done[0]["sizes"] and done[0]["sizes"][0] == 2


@pytest.mark.parametrize("stop_after", [0.0, 3.0, None], ids=["stopped-at-once", "stopped-3s-later", "deleted-while-listed"])
def test_scale_down_the_removed_worker_leaves_gracefully(k8s_jobs, stop_after):
    """Unlisted, then stopped (at once or 3 s later); or as Kubernetes orders it (None): deleted at
    once, so its preStop hook ends its ranks while discover_hosts.sh still lists it."""
    job = elastic_job(k8s_jobs, steps=5000, replicas=3, np_=3)  # ended by stop_soon once the worker is stopped
    job.start()
    wait_for("the first step at size 3", lambda: steps_at(job, 3), job)
    lowered = time.time()
    stopper = job.scale(2, stop_after=stop_after)
    first = FirstStep(job, 2)
    wait_for("a step at size 2", first, job)
    print(f"\n[k8s] scale-down: replicas lowered -> survivors' first step at size 2: {first.first - lowered:.2f} s")
    stopper.join(60)
    log = job.logs(job.launcher)
    done = finish(job, stop_soon(job))
    assert done[0]["sizes"][-1] == 2
    # a graceful leave, no blacklist (it may come back when replicas grow): out of discovery, and
    # deleted with the manifest's preStop hook, which ends the pod's ranks with SIGTERM before
    # Kubernetes stops sshd (the pod's PID 1, whose exit kills every process in it)
    assert not [ln for ln in log.splitlines() if "worker-2" in ln and "blacklist" in ln], log[-3000:]
    if stop_after is None:  # its rank left on the hook's SIGTERM, before the pod left discovery
        assert "was sent SIGTERM: it leaves the job at its next commit" in log, log[-3000:]
        assert first.first < next(t for t, hosts in job.discovery_log if len(hosts) == 2), job.discovery_log


def test_workers_started_after_the_launcher_are_waited_for_without_the_launchers_dns_name(k8s_jobs):
    """launcherCreationPolicy AtStartup: the launcher may come first, and its pod may have no DNS
    record the workers can resolve; neither matters (the workers never look the launcher up)."""
    job = elastic_job(k8s_jobs, steps=60, launcher_dns=False)
    job.start(workers=False)
    wait_for("the launcher waiting for its slots", lambda: "waiting for 2 slots (0 available" in job.logs(job.launcher), job)
    for i in range(2):
        job.start_worker(i)
    probe = job.workers[0].container_obj.exec_run(["getent", "hosts", job.host_name(job.launcher_pod_name())])
    assert probe.exit_code != 0, probe.output  # the workers cannot resolve the launcher
    first = FirstStep(job, 2)
    wait_for("the first step", first, job)
    listed = next(t for t, hosts in job.discovery_log if len(hosts) == 2)
    print(f"\n[k8s] workers after the launcher: both listed -> first step: {first.first - listed:.2f} s")
    done = finish(job, 60)
    assert set(done[0]["sizes"]) == {2}


SSHD_LATE_S = 8  # a pending host is checked again 1, 3, 7, 15 s after its first check failed: it joins at the 7 s one


def test_a_listed_worker_whose_sshd_is_late_is_pending_then_joins(k8s_jobs):
    job = elastic_job(k8s_jobs, steps=5000)  # ended by stop_soon once the worker joined
    started(job)
    job.replicas = 3
    created = time.time()
    job.start_worker(2, sshd_delay=SSHD_LATE_S)  # Running (listed) before its sshd listens
    first = FirstStep(job, 3)
    wait_for("a step at size 3", first, job, timeout=120)
    listed = next(t for t, hosts in job.discovery_log if len(hosts) == 3)
    print(f"\n[k8s] late sshd: listed -> first step at size 3: {first.first - listed:.2f} s (sshd {SSHD_LATE_S} s late)")
    assert first.first - created >= SSHD_LATE_S  # it joined once its sshd listened, not before
    done = finish(job, stop_soon(job))
    assert done[0]["sizes"][-1] == 3


def test_a_crashed_rank_in_a_running_pod_then_a_crashed_pod_recreated_under_its_name_rejoin(k8s_jobs):
    """One job, two crashes of worker 1. Its rank crashes while the pod stays Running (sshd lives),
    so discover_hosts.sh keeps listing it: Horovod's permanent blacklist would strand it; the
    cool-down lets it back. Then the pod itself crashes (phase Failed: it leaves the listing) and
    is re-created under the same name, which the job takes back too."""
    job = elastic_job(k8s_jobs, steps=5000, flags=SHORT_COOLDOWN)  # ended by stop_soon once the worker is back
    started(job)
    step = max(json.loads(f.read_text())["step"] for f in records(job, "step.*"))
    switch(job, "kill.1", step + 5)  # worker 1 SIGKILLs itself there
    wait_for("a step at size 1", lambda: steps_at(job, 1), job)
    crashed = time.time()
    first = FirstStep(job, 2, after=crashed)
    wait_for("a step at size 2 again", first, job, timeout=150)
    print(f"\n[k8s] crashed rank, pod still listed: back at size 2 after {first.first - crashed:.2f} s (the cool-down)")
    assert all(len(hosts) == 2 for _, hosts in job.discovery_log)  # never left discovery
    back = max(json.loads(f.read_text())["step"] for f in records(job, "step.*"))
    wait_for("a commit at size 2 (the steps before one are rolled back by the next crash)",
             lambda: steps_past(job, 2, back + 2 * COMMIT), job)

    job.crash_worker(1)
    wait_for("a step at size 1 after the pod's crash", lambda: steps_at(job, 1, after=first.first), job)
    wait_for("the crashed pod out of discover_hosts.sh", lambda: any(len(h) == 1 for _, h in job.discovery_log), job)
    recreated = time.time()
    job.start_worker(1)  # the user deletes the failed pod; the operator re-creates the same name
    again = FirstStep(job, 2, after=recreated)
    wait_for("a step at size 2 after the re-creation", again, job, timeout=150)
    listed = next(t for t, hosts in job.discovery_log if t > recreated and len(hosts) == 2)
    print(f"\n[k8s] crash + re-create: listed again -> first step at size 2: {again.first - listed:.2f} s "
          f"(re-created -> first step {again.first - recreated:.2f} s)")
    done = finish(job, stop_soon(job))
    sizes = done[0]["sizes"]
    runs = [n for i, n in enumerate(sizes) if i == 0 or sizes[i - 1] != n]  # the sizes in the order they ran
    assert runs == [2, 1, 2, 1, 2], sizes
