"""The default training job (appliance/examples/train.py) as a user runs it.

Accuracy floor: 0.90 on the held-out digits after 5 epochs (measured: ~0.95-0.97). One rank
with global batch B and two ranks with B/2 each follow the same trajectory.
"""
import json
import sys

import torch

from appliance.launcher import launch

ACCURACY_FLOOR = 0.90


def run_train(tmp_path, np_):
    out = tmp_path / f"model-{np_}"
    res = launch([sys.executable, "-m", "appliance.examples.train", "--epochs", "5", "--checkpoint-dir", str(out)],
                 np=np_, hosts=f"localhost:{np_}", timeout=180, cwd=str(tmp_path))
    assert res.returncode == 0, res.output()[-4000:]
    return res, out


def test_training_job_learns_and_checkpoints(tmp_path):
    res, out = run_train(tmp_path, 2)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["size"] == 2 and len(metrics["epochs"]) == 5
    assert metrics["epochs"][-1]["accuracy"] >= ACCURACY_FLOOR, metrics
    assert metrics["epochs"][-1]["loss"] < metrics["epochs"][0]["loss"]
    ckpt = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ckpt["epoch"] == 5 and ckpt["size"] == 2 and "model" in ckpt
    # only rank 0 prints, every line prefixed
    stdout = [t for r, s, t in res.lines if s == "stdout"]
    assert any("epoch 5/5" in t for t in stdout)
    assert {r for r, s, t in res.lines if s == "stdout"} == {0}
    # the first line names every rank's device (no GPU here: the CPU)
    assert stdout[0].startswith("devices: rank 0 cpu@") and ", rank 1 cpu@" in stdout[0], stdout[0]


def test_two_ranks_follow_the_single_rank_trajectory(tmp_path):
    _, one = run_train(tmp_path, 1)
    _, two = run_train(tmp_path, 2)
    m1 = json.loads((one / "metrics.json").read_text())["epochs"]
    m2 = json.loads((two / "metrics.json").read_text())["epochs"]
    for a, b in zip(m1, m2):
        assert abs(a["loss"] - b["loss"]) < 1e-3, (a, b)
        assert abs(a["accuracy"] - b["accuracy"]) <= 2 / 297, (a, b)
