"""A host's ranks leaving an elastic job gracefully over real sshd hosts (the SSH tier's
network-namespace hosts, each with its own hostname): ``appliance leave``, run on one host as a
Kubernetes preStop hook runs in a pod being deleted, finds that host's ranks from the remote
stubs' records, sends them SIGTERM and waits for them. With APPLIANCE_ELASTIC_LEAVE_ON_TERM (set by
the launcher on Kubernetes) each one leaves at the next commit: it exits 0, the others go on at
the smaller size without restoring, the host is not blacklisted, nothing is left on any host.

The job directory root (APPLIANCE_JOB_DIR) is the test's own, so the command never sees another
job's records; every host shares this filesystem, so the command must also skip the other hosts'
ranks (their records name their hostname).
"""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fixtures.elastic import ElasticJob, alive, check_consistent
from fixtures.netns import PORT

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(180)]


def on_host(host, *argv: str) -> subprocess.Popen:
    """Start ``argv`` on ``host`` (its network and hostname), as a pod's preStop hook runs in the pod."""
    return subprocess.Popen(["nsenter", "--target", str(host.sshd.pid), "--net", "--uts", "--", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_leave_command_on_a_host_ends_its_rank_gracefully_at_the_next_commit(cluster, tmp_path):
    h1, h2 = cluster.hosts
    root = tmp_path / "jobs"
    steps, commit = 60, 4
    with ElasticJob(tmp_path / "job", steps=steps, commit=commit, step_s=0.1) as job:
        job.start(3, min_np=1, max_np=3, hosts=f"localhost:1,{h1.address}:1,{h2.address}:1", ssh_port=PORT,
                  env={"APPLIANCE_ELASTIC_LEAVE_ON_TERM": "1", "APPLIANCE_JOB_DIR": str(root)})
        job.wait_for(lambda: job.max_step() >= commit + 2, what="steps after the first commit")
        at = job.max_step()
        sent = time.time()
        cmd = on_host(h2, sys.executable, "-m", "appliance.launcher.ssh.leave", "--job-dir", str(root),
                      "--timeout", "30")
        try:
            job.wait_for(lambda: any(p["size"] == 2 for p in job.progress().values()), 30, "a step at size 2")
            lag = min(p["t"] for p in job.progress().values() if p["size"] == 2) - sent
            _, err = cmd.communicate(timeout=40)
        finally:
            cmd.kill()
            cmd.wait()
        took = time.time() - sent
        assert cmd.returncode == 0, err
        assert "sent SIGTERM to 1 rank(s) here" in err, err  # not the other hosts' ranks (same filesystem)
        r = job.wait(90)
        assert r.returncode == 0, r.reason
        done = job.done()
        sizes = check_consistent(done, steps)
        kept = sizes.count(3)
        assert sizes == [3] * kept + [2] * (steps - kept) and kept >= at and kept % commit == 0, (at, sizes)
        assert len(done) == 2 and all(d["restores"] == 0 and d["syncs"] == 1 for d in done.values()), done
        gone = set(job.pids()) - set(done)
        assert len(gone) == 1 and not alive(job.pids()[gone.pop()])
        assert job.leftovers() == []
    text = r.output(stream="stderr")
    assert "was sent SIGTERM: it leaves the elastic job at its next commit" in text, text
    assert "leaves the elastic job: it was sent SIGTERM" in text, text
    assert "blacklist" not in text and "failed" not in text, text
    assert took < 20.0, took
    print(f"leave command: {took:.2f} s; SIGTERM to the survivors' first step at size 2: {lag:.2f} s")
