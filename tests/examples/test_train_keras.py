"""The Keras example job (appliance/examples/train_keras.py) as a user runs it: one 2-rank launch.

Checked in that one run (a TensorFlow rank costs seconds to start, so one run checks it all): the
loss falls and the held-out accuracy passes a floor (measured ~0.95 after 2 epochs), the ranks end
with the same weights (the digests rank 0 prints, one per rank), ``checkpoint.keras`` and
``metrics.json`` exist in the run's directory on the share and were renamed into place by rank 0
only (an audit hook in every rank's interpreter logs each rename into that directory with its
rank: the job's own output is not trusted for it), the run lock is released, and the launcher's
record holds each rank's steps and samples (reported from the job's Keras callback) and a
report.png.
"""
import json
import os
import sys
import textwrap
import zipfile

import pytest

from appliance.launcher import launch

pytestmark = pytest.mark.timeout(240, func_only=True)

ACCURACY_FLOOR = 0.90
EPOCHS = 2

# Loaded by every rank through PYTHONPATH: logs (rank, source, destination) of every rename into
# the checkpoint directory, one JSON line per rename, to a file of the test's.
RENAMES_HOOK = textwrap.dedent("""
    import json, os, sys
    _log, _dir = os.environ["TEST_RENAMES_LOG"], os.environ["TEST_RENAMES_DIR"]

    def _hook(event, args):
        if event == "os.rename" and os.path.abspath(os.fsdecode(args[1])).startswith(_dir + os.sep):
            with open(_log, "a") as f:
                f.write(json.dumps([os.environ.get("HOROVOD_RANK"), os.fsdecode(args[1])]) + "\\n")

    sys.addaudithook(_hook)
""")


def test_keras_job_trains_on_two_ranks_and_rank_0_checkpoints(tmp_path):
    shared, record, hook = tmp_path / "share", tmp_path / "record", tmp_path / "hook"
    shared.mkdir()
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(RENAMES_HOOK)
    run_dir = shared / "models" / "digits-keras"
    renames = tmp_path / "renames.jsonl"
    env = {"PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
           "TEST_RENAMES_LOG": str(renames), "TEST_RENAMES_DIR": str(run_dir),
           "APPLIANCE_RECORD_DIR": str(record), "APPLIANCE_VIEW": "off", "TF_CPP_MIN_LOG_LEVEL": "2"}
    res = launch([sys.executable, "-m", "appliance.examples.train_keras", "--epochs", str(EPOCHS),
                  "--shared", str(shared)], np=2, hosts="localhost:2", env=env, timeout=200, cwd=str(tmp_path))
    out = res.output()
    assert res.returncode == 0, out[-4000:]

    stdout = [t for r, s, t in res.lines if s == "stdout"]
    assert {r for r, s, t in res.lines if s == "stdout"} == {0}, out[-3000:]
    digests = [t for t in stdout if t.startswith("weights sha256: ")]
    assert len(digests) == 1, out[-3000:]
    per_rank = [part.split() for part in digests[0][len("weights sha256: "):].split(", ")]
    assert [p[:2] for p in per_rank] == [["rank", "0"], ["rank", "1"]], digests
    assert per_rank[0][2] == per_rank[1][2], f"the ranks' weights differ: {digests[0]}"

    metrics = json.loads((run_dir / "metrics.json").read_text())
    epochs = metrics["epochs"]
    assert metrics["size"] == 2 and [e["epoch"] for e in epochs] == list(range(1, EPOCHS + 1)), metrics
    assert epochs[-1]["loss"] < epochs[0]["loss"], epochs
    assert epochs[-1]["accuracy"] >= ACCURACY_FLOOR, epochs
    with zipfile.ZipFile(run_dir / "checkpoint.keras") as z:
        assert "model.weights.h5" in z.namelist(), z.namelist()
    writes = [json.loads(line) for line in renames.read_text().splitlines()]
    assert {rank for rank, _ in writes} == {"0"}, writes
    assert sorted(os.path.basename(dst) for _, dst in writes) == sorted(["checkpoint.keras", "metrics.json"] * EPOCHS)
    assert not [p for p in os.listdir(run_dir) if p.startswith(".")], os.listdir(run_dir)
    locks = shared / "locks"
    assert not locks.exists() or not [p for p in os.listdir(locks) if p.endswith(".lock")], os.listdir(locks)

    rows = [json.loads(line) for line in (record / "metrics.jsonl").read_text().splitlines()]
    last = {}
    for row in rows:
        if row.get("kind") == "rank":
            last[row["rank"]] = row
    assert sorted(last) == [0, 1], rows[:3]
    for rank, row in last.items():
        assert row["step"] == 23 * EPOCHS and row["samples"] == 32 * 23 * EPOCHS and row["total_steps"] == 23 * EPOCHS, row
    assert (record / "report.png").stat().st_size > 0
