"""The default training job (appliance/examples/train.py) as a user runs it.

Accuracy floor: 0.90 on the held-out digits after 5 epochs (measured: ~0.95-0.97). One rank
with global batch B and two ranks with B/2 each follow the same trajectory.
"""
import json
import sys

import pytest
import torch

from appliance.launcher import launch

ACCURACY_FLOOR = 0.90


def run_train(tmp_path, np_):
    out = tmp_path / f"model-{np_}"
    res = launch([sys.executable, "-m", "appliance.examples.train", "--epochs", "5", "--checkpoint-dir", str(out)],
                 np=np_, hosts=f"localhost:{np_}", timeout=180, cwd=str(tmp_path))
    assert res.returncode == 0, res.output()[-4000:]
    return res, out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One 2-rank run of 5 epochs, read by both tests below (neither writes to it)."""
    return run_train(tmp_path_factory.mktemp("two-ranks"), 2)


def test_training_job_learns_and_checkpoints(two_ranks):
    res, out = two_ranks
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


def test_two_ranks_follow_the_single_rank_trajectory(tmp_path, two_ranks):
    _, one = run_train(tmp_path, 1)
    _, two = two_ranks
    m1 = json.loads((one / "metrics.json").read_text())["epochs"]
    m2 = json.loads((two / "metrics.json").read_text())["epochs"]
    for a, b in zip(m1, m2):
        assert abs(a["loss"] - b["loss"]) < 1e-3, (a, b)
        assert abs(a["accuracy"] - b["accuracy"]) <= 2 / 297, (a, b)


# --- crashes: checkpoint and metrics.json agree after every kill, and after a resume ----------
import os  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402


class Job:
    """``python -m appliance.examples.train`` as one rank on its own, in its own session; its
    output lines collected by a thread (``seen(text)`` says whether one has appeared)."""

    def __init__(self, shared, *args):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "appliance.examples.train", "--shared", str(shared), "--run", "r",
             "--device", "cpu", *map(str, args)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=shared)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def seen(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.reader.join(timeout=10)

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        return code


def _state(model_dir):
    """(checkpoint or None, metrics.json or None)."""
    ckpt_path, metrics_path = model_dir / "checkpoint.pt", model_dir / "metrics.json"
    ckpt = torch.load(ckpt_path, weights_only=True) if ckpt_path.exists() else None
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else None
    return ckpt, metrics


def _assert_consistent_after_kill(model_dir) -> str:
    """What a kill may leave: nothing; or a checkpoint whose own metrics match it, with
    metrics.json equal to them, or one epoch behind when the kill fell between the two renames
    (the next start rebuilds it). Returns which of these it was."""
    ckpt, metrics = _state(model_dir)
    if ckpt is None:
        assert metrics is None, "metrics.json without a checkpoint"
        return "none"
    own = ckpt["metrics"]["epochs"]
    assert [e["epoch"] for e in own] == list(range(1, ckpt["epoch"] + 1))
    assert own[-1]["accuracy"] == ckpt["accuracy"]
    if metrics == ckpt["metrics"]:
        return "agree"
    assert metrics is not None and metrics["epochs"] == own[:-1], (ckpt["epoch"], metrics and len(metrics["epochs"]))
    return "behind"


def test_checkpoint_and_metrics_agree_after_kills_at_random_moments(tmp_path):
    seed = int(os.environ.get("APPLIANCE_TEST_SEED", time.time()))
    rng = random.Random(seed)
    model_dir = tmp_path / "models" / "r"
    outcomes, takeovers = [], 0
    for i in range(6):
        job = Job(tmp_path, "--epochs", 100000)
        try:
            if i % 2 == 0:  # in the middle of training
                deadline = time.monotonic() + 60
                while not job.seen("epoch "):
                    assert job.proc.poll() is None and time.monotonic() < deadline, (seed, job.lines[-20:])
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 1.0))
            else:  # anywhere: starting, taking the lock, resuming, training
                time.sleep(rng.uniform(0.2, 4.0))
        finally:
            job.kill()
        takeovers += job.seen("took over the lock of run 'r'")
        outcomes.append(_assert_consistent_after_kill(model_dir))
    assert (tmp_path / "locks" / "run-r.lock").exists()  # the last kill left its lock behind

    # The resume: the dead holder's lock is taken over at once, metrics.json is rebuilt first,
    # and the job trains to the end on the trajectory of an uninterrupted run.
    # The uninterrupted reference run starts beside it, in its own directory.
    ckpt, _ = _state(model_dir)
    target = (ckpt["epoch"] if ckpt else 0) + 2
    reference = tmp_path / "reference"
    reference.mkdir()
    job, ref = Job(tmp_path, "--epochs", target), Job(reference, "--epochs", target)
    try:
        assert job.wait(timeout=120) == 0, (seed, job.lines[-20:])
        assert job.seen("took over the lock of run 'r'"), (seed, job.lines[:5])
        ckpt, metrics = _state(model_dir)
        assert ckpt["epoch"] == target and metrics == ckpt["metrics"], seed
        assert sorted(os.listdir(model_dir)) == ["checkpoint.pt", "metrics.json"]  # no temporaries left
        assert not (tmp_path / "locks" / "run-r.lock").exists()
        assert ref.wait(timeout=120) == 0, ref.lines[-20:]
    finally:
        ref.kill()
    _, ref_metrics = _state(reference / "models" / "r")
    assert [e["loss"] for e in metrics["epochs"]] == [e["loss"] for e in ref_metrics["epochs"]], seed
    print(f"seed {seed}: after each kill {outcomes}; takeovers by the next start: {takeovers}")


def test_a_start_rebuilds_metrics_that_disagree_with_the_checkpoint(tmp_path):
    model_dir = tmp_path / "models" / "r"
    assert Job(tmp_path, "--epochs", 2).wait(timeout=120) == 0
    ckpt, good = _state(model_dir)
    # Each damage in its own copy of the run's directory, the starts that repair them all at once.
    # "leftover": metrics.json without any checkpoint is a leftover of something else: removed.
    damages = {"missing": None, "behind": json.dumps({**good, "epochs": good["epochs"][:1]}),
               "torn": json.dumps(good)[:50], "foreign": json.dumps({"size": 7, "epochs": []}), "leftover": ""}
    jobs = {}
    try:
        for damage, text in damages.items():
            shared = tmp_path / damage
            shutil.copytree(model_dir, shared / "models" / "r")
            path = shared / "models" / "r" / "metrics.json"
            if damage == "leftover":
                (path.parent / "checkpoint.pt").unlink()
                jobs[damage] = Job(shared, "--epochs", 1, "--fresh")
                continue
            if text is None:
                path.unlink()
            else:
                path.write_text(text)
            jobs[damage] = Job(shared, "--epochs", 2)  # nothing left to train: only the repair runs
        for damage, job in jobs.items():
            assert job.wait(timeout=120) == 0, (damage, job.lines[-20:])
            metrics = json.loads((tmp_path / damage / "models" / "r" / "metrics.json").read_text())
            if damage == "leftover":
                assert job.seen("removed") and metrics["epochs"][0]["epoch"] == 1, job.lines[-20:]
            else:
                assert metrics == ckpt["metrics"] and job.seen("rebuilt"), (damage, job.lines[-20:])
    finally:
        for job in jobs.values():
            job.kill()
