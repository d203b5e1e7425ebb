"""A rank of an elastic job sent SIGTERM leaves at the next commit (APPLIANCE_ELASTIC_LEAVE_ON_TERM,
set by the launcher on Kubernetes, where a pod being deleted gets SIGTERM): real launcher, driver,
worker processes and sockets on this machine; "hosts" are loopback addresses.

What is asserted: the rank asked to leave exits 0 after the next commit (its line says so), the
others go on at the smaller size from where they were, never restoring (no rollback: every step
run at the old size is kept, no rank restored or synced again, no failure line), the host is not
blacklisted, the job exits 0 and nothing is left running; a second SIGTERM ends the rank as
SIGTERM would without the handler. The same over real sshd hosts, through the remote stub and the
``leave`` command a Kubernetes preStop hook runs, is in ``ssh/test_elastic_ssh.py``.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from fixtures.elastic import ElasticJob, alive, check_consistent

pytestmark = pytest.mark.timeout(120)

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"
LEAVE = {"APPLIANCE_ELASTIC_LEAVE_ON_TERM": "1"}


def first_step_at(job: ElasticJob, size: int) -> float:
    """The wall time of the first step a worker wrote at ``size`` (read while it is the newest)."""
    job.wait_for(lambda: any(p["size"] == size for p in job.progress().values()), 60, f"a step at size {size}")
    return min(p["t"] for p in job.progress().values() if p["size"] == size)


def test_a_rank_sent_sigterm_leaves_at_the_next_commit_and_the_others_go_on_without_rollback(tmp_path, capfd):
    steps, commit = 40, 4
    with ElasticJob(tmp_path, steps=steps, commit=commit, step_s=0.1) as job:
        job.start(3, min_np=1, max_np=3, hosts=f"{A}:1,{B}:1,{C}:1", env=LEAVE)
        job.wait_for(lambda: job.max_step() >= commit + 2, what="steps after the first commit")
        pid = job.pids()[2]
        at = job.progress()[2]["step"]
        sent = time.time()
        os.kill(pid, signal.SIGTERM)
        lag = first_step_at(job, 2) - sent
        r = job.wait(90)
        assert r.returncode == 0, r.reason
        done = job.done()
        sizes = check_consistent(done, steps)
        kept = sizes.count(3)
        assert sizes == [3] * kept + [2] * (steps - kept), sizes
        assert kept >= at and kept % commit == 0, (at, sizes)   # the steps since the last commit are kept
        assert sorted(done) == [0, 1] and sorted(job.pids()) == [0, 1, 2]
        assert all(d["restores"] == 0 and d["syncs"] == 1 and d["resets"] == 1 for d in done.values()), done
        assert not alive(pid) and job.leftovers() == []
    out = capfd.readouterr()
    text = out.out + out.err + r.output(stream="stderr")
    assert "worker 2 was sent SIGTERM: it leaves the elastic job at its next commit" in text
    assert "worker 2 leaves the elastic job: it was sent SIGTERM" in text
    assert "blacklist" not in text and "HorovodInternalError" not in text and "failed" not in text, text
    print(f"lag from SIGTERM to the survivors' first step at size 2: {lag:.2f} s")
    assert lag < 10.0, lag


def test_a_second_sigterm_ends_the_rank_and_the_others_restore_the_last_commit(tmp_path, capfd):
    """The leave is asked for at the first SIGTERM; a second one before the commit ends the rank
    at once (as without the handler): a leave all the same (no blacklist), the others restore."""
    steps = 30
    with ElasticJob(tmp_path, steps=steps, commit=steps, step_s=0.1) as job:  # no commit before the end
        job.start(3, min_np=1, max_np=3, hosts=f"{A}:1,{B}:1,{C}:1", env=LEAVE)
        job.wait_for(lambda: job.max_step() >= 3, what="a few steps")
        pid = job.pids()[2]
        os.kill(pid, signal.SIGTERM)
        job.wait_for(lambda: (tmp_path / "notice.2").exists(), 20, "the notice the leave causes")
        os.kill(pid, signal.SIGTERM)
        r = job.wait(90)
        assert r.returncode == 0, r.reason
        done = job.done()
        assert sorted(done) == [0, 1] and all(d["restores"] == 1 for d in done.values()), done
        assert not alive(pid) and job.leftovers() == []
    text = "".join(capfd.readouterr()) + r.output(stream="stderr")
    assert "ended by SIGTERM: it leaves the job (not a failure)" in text and "blacklisted" not in text, text
