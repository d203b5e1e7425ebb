"""``appliance launch --min-np`` inside a real Slurm allocation: an elastic job over the allocation's
nodes, each rank a step of its own (the two-node cluster of ``tests/fixtures/slurm.py``).

A node's task is SIGKILLed mid-training: that step ends alone, the node is blacklisted and the rank
on the other node goes on from the last commit. With a cool-down the node comes back and a new
step starts there: the job grows back inside the allocation (Slurm does not let a running
allocation gain nodes, so the allocation's nodes are the most an elastic job can use). Effects
checked: exit codes, the state the finished workers report (``tests/ranks/elastic_steps.py``),
the node each worker ran on, and that nothing of the job is left in the cluster.

Every rank on both nodes (2 x 2, so two steps share each node) raising at the same step ends the
job within 5 s of its last step with Horovod's phrase naming every rank and its exit, with the
default graces.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fixtures

ROOT = Path(os.environ.get("APPLIANCE_SLURM_TEST_ROOT") or fixtures.ROOT)
WORKER = ROOT / "tests" / "ranks" / "elastic_steps.py"
PY = sys.executable

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(150)]


def elastic_launch(slurm, tmp_path: Path, args: list[str], steps: int, commit: int = 2, per_node: int = 1,
                   step_s: float = 0.05) -> tuple[Path, Path, list]:
    out, home = tmp_path / "out", tmp_path / "home"
    out.mkdir()
    home.mkdir()
    return out, home, ["salloc", "-N2", f"--ntasks-per-node={per_node}", "--no-kill", "--", PY, "-m", "appliance",
                       "launch", *args, "--", PY, str(WORKER), str(out), str(steps), str(commit), str(step_s)]


def run(slurm, argv, home: Path, timeout: float = 100) -> subprocess.CompletedProcess:
    env = {"HOME": str(home), "PYTHONPATH": str(ROOT), "APPLIANCE_DISCOVERY_INTERVAL": "0.2",
           "APPLIANCE_STOP_GRACE": "1", "APPLIANCE_FAILURE_GRACE": "1"}
    p = slurm.popen(argv, env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate(timeout=10)
        pytest.fail(f"the elastic launch did not end within {timeout} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def done(out: Path) -> dict[int, dict]:
    return {int(p.name.split(".")[1]): json.loads(p.read_text()) for p in out.glob("done.*")}


def test_a_nodes_task_killed_the_job_goes_on_on_the_other_node(slurm, tmp_path):
    out, home, argv = elastic_launch(slurm, tmp_path, ["-np", "2", "--min-np", "1"], steps=30)
    (out / "kill.1").write_text("7")  # worker 1: the rank on node2
    r = run(slurm, argv, home)
    assert r.returncode == 0, r.stderr[-4000:]
    finished = done(out)
    assert sorted(finished) == [0]
    sizes = finished[0]["sizes"]
    assert sizes == [2] * 6 + [1] * 24 and finished[0]["w"] == [float(sum(sizes))] * 4
    assert "worker 1 (rank 1, host node2) was killed by signal 9" in r.stderr
    assert slurm.wait_no_strays(5) == {}
    assert not list((home / ".appliance" / "slurm").glob("launch-*"))  # the steps' directory is removed


def test_a_node_back_after_its_cooldown_gets_a_new_step(slurm, tmp_path):
    out, home, argv = elastic_launch(slurm, tmp_path, ["-np", "2", "--min-np", "1",
                                                       "--blacklist-cooldown-range", "1", "1"], steps=120)
    (out / "kill.1").write_text("5")
    r = run(slurm, argv, home)
    assert r.returncode == 0, r.stderr[-4000:]
    finished = done(out)
    assert sorted(finished) == [0, 2], r.stderr[-3000:]  # worker 2: the new step on node2
    assert "round 3: 2 ranks (+1) on node1, node2" in r.stderr
    sizes = finished[0]["sizes"]
    assert sizes[:4] == [2] * 4 and 1 in sizes and sizes[-1] == 2 and finished[2]["sizes"] == sizes
    assert slurm.wait_no_strays(5) == {}


HOROVOD_FAILED = "Horovod detected that one or more processes exited with non-zero status"


def test_every_rank_on_both_nodes_failing_at_once_ends_the_job_within_5_s(slurm, tmp_path):
    """All 4 ranks (2 nodes x 2, each rank a step of its own) raise at the same step: the job fails
    at once with Horovod's phrase, naming every rank and its exit; no step or task is left."""
    out, home, argv = elastic_launch(slurm, tmp_path, ["-np", "4", "--min-np", "1", "--elastic-timeout", "60"],
                                     steps=40, commit=1, per_node=2, step_s=0.1)
    for w in range(4):
        (out / f"fail.{w}").write_text("6")
    env = {"HOME": str(home), "PYTHONPATH": str(ROOT)}  # the default graces: the bound holds without tuning
    log = tmp_path / "stderr"
    with open(log, "w") as f:  # a file, not a pipe: nothing reads it while the test polls
        p = slurm.popen(argv, env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=f, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        steps: dict[int, dict] = {}
        while time.monotonic() < deadline and p.poll() is None:
            steps = {}
            for f in out.glob("step.*"):
                try:
                    steps[int(f.name.split(".")[1])] = json.loads(f.read_text())
                except (ValueError, OSError):
                    pass
            if len(steps) == 4 and min(s["step"] for s in steps.values()) >= 5:
                break
            time.sleep(0.05)
        if not (len(steps) == 4 and min(s["step"] for s in steps.values()) >= 5):
            pytest.fail(f"not every rank reached step 5: {steps}\n{log.read_text()[-3000:]}")
        failed = max(s["t"] for s in steps.values())
        p.wait(timeout=60)
        took = time.time() - failed
    except subprocess.TimeoutExpired:
        pytest.fail(f"the elastic launch did not end within 60 s of every rank failing:\n{log.read_text()[-3000:]}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait(timeout=10)
    err = log.read_text()
    print(f"\nevery rank failed: the launch returned {took:.2f} s after the last step")
    assert p.returncode != 0 and HOROVOD_FAILED in err, err[-4000:]
    line = next(ln for ln in err.splitlines() if HOROVOD_FAILED in ln)
    for rank, node in enumerate(("node1", "node1", "node2", "node2")):
        assert f"rank {rank}, host {node}) exited with code 1" in line or \
            f"rank {rank}, host {node}) was killed by signal 15" in line, line
    assert line.count("exited with code 1") >= 2, line
    assert took < 5.0, (took, err[-3000:])
    assert done(out) == {}
    assert slurm.wait_no_strays(5) == {}
    assert not list((home / ".appliance" / "slurm").glob("launch-*"))
