"""``appliance launch --min-np`` inside a real Slurm allocation: an elastic job over the allocation's
nodes, each rank a step of its own (the two-node cluster of ``tests/fixtures/slurm.py``).

A node's task is SIGKILLed mid-training: that step ends alone, the node is blacklisted and the rank
on the other node goes on from the last commit. With a cool-down the node comes back and a new
step starts there: the job grows back inside the allocation (Slurm does not let a running
allocation gain nodes, so the allocation's nodes are the most an elastic job can use). Effects
checked: exit codes, the state the finished workers report (``tests/ranks/elastic_steps.py``),
the node each worker ran on, and that nothing of the job is left in the cluster.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fixtures

ROOT = Path(os.environ.get("APPLIANCE_SLURM_TEST_ROOT") or fixtures.ROOT)
WORKER = ROOT / "tests" / "ranks" / "elastic_steps.py"
PY = sys.executable

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(150)]


def elastic_launch(slurm, tmp_path: Path, args: list[str], steps: int, commit: int = 2) -> tuple[Path, Path, list]:
    out, home = tmp_path / "out", tmp_path / "home"
    out.mkdir()
    home.mkdir()
    return out, home, ["salloc", "-N2", "--ntasks-per-node=1", "--no-kill", "--", PY, "-m", "appliance", "launch",
                       *args, "--", PY, str(WORKER), str(out), str(steps), str(commit), "0.05"]


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
