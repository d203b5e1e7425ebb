"""The launcher's view of a job started by srun inside a real Slurm allocation (two nodes).

``salloc -N2 -- appliance launch -np 4 -- observe_worker.py`` (``tests/ranks/observe_worker.py``,
rank 3 slower per step): the srun step's tasks get APPLIANCE_METRICS_ADDR too, so the summary
lines count 4 ranks on the two nodes, the straggler is named with its node, and the record in the
job directory has every rank.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fixtures

ROOT = Path(os.environ.get("APPLIANCE_SLURM_TEST_ROOT") or fixtures.ROOT)
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]


def test_srun_job_is_seen_and_recorded(slurm, tmp_path):
    rec, home = tmp_path / "rec", tmp_path / "home"
    home.mkdir()
    argv = ["salloc", "-N2", "--ntasks-per-node=2", "--", sys.executable, "-m", "appliance", "launch", "-np", "4",
            "--", sys.executable, str(fixtures.RANKS / "observe_worker.py"), "120", "40", "3", "40", "1000"]
    p = slurm.popen(argv, env={"HOME": str(home), "PYTHONPATH": str(ROOT), "APPLIANCE_RECORD_DIR": str(rec),
                               "APPLIANCE_VIEW_INTERVAL": "1", "APPLIANCE_METRICS_INTERVAL": "0.5"},
                    cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=150)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=10)
    assert p.returncode == 0, err[-4000:]
    assert re.search(r"^appliance launch: job \w+ · 4/4 ranks on 2 hosts · step \d+/120 ", err, re.M), err[-3000:]
    assert "appliance launch: straggler: rank 3 on node2 keeps the others waiting" in err, err[-3000:]
    rows = [json.loads(line) for line in (rec / "metrics.jsonl").read_text().splitlines()]
    assert {(r["rank"], r["host"]) for r in rows if r["kind"] == "rank"} == {
        (0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")}
