"""Elastic Keras ``fit`` in real elastic jobs on this machine: a host discovery script and loopback
hosts (``fixtures.elastic_grow.GrowJob``, as tests/tensorflow/test_tf_elastic.py uses it), the rank
program ``tests/ranks/keras_elastic.py`` (``hvd.elastic.run`` around ``model.fit`` with
``KerasState`` and the Commit/UpdateBatch/UpdateEpoch callbacks), one job per Keras.

Asserted effects: under tf-keras (``TF_USE_LEGACY_KERAS=1``) and ``appliance launch``, two ranks
train and one is SIGKILLed as a batch in the middle of an epoch begins; under Keras 3 and
``horovodrun --min-np 1``, a job of one rank grows to two when a host appears in the middle of an
epoch (the newcomer takes rank 0's model and optimizer, the epoch is shortened by the batches
done), then the new rank is SIGKILLed mid-epoch. Either way the survivor stays in the same process
(its PID never changes), is reset at each change of size, resumes ``fit`` from the last commit and
ends after exactly EPOCHS x STEPS batches: every global step taken once per rank by as many ranks as
the job had then, every rank holding the same model after it, each logged at its epoch and batch,
the killed step taken again alone, and the final model equal to a one-process replay of those sizes
(no committed batch lost or doubled); rc 0 and no process left. Needs TensorFlow (conftest.py);
pytest itself never imports it.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import RANKS, ROOT
from fixtures.elastic_grow import GrowJob

pytestmark = pytest.mark.timeout(240)

EPOCHS, STEPS, KILL = 3, 6, 10  # the kill: epoch 1, its 4th batch
GROW = 3  # the growth: epoch 0, its 3rd batch
A, B = "127.0.0.2", "127.0.0.3"


class KerasJob(GrowJob):
    """A GrowJob of ``tests/ranks/keras_elastic.py`` (a fixed number of epochs: no stop file)."""

    def start(self, cli: list[str], *, legacy: bool = False, **_) -> "KerasJob":
        bin_dir = Path(sys.executable).parent
        argv = [str(bin_dir / cli[0]), *cli[1:], "--host-discovery-script", str(self.script),
                sys.executable, str(RANKS / "keras_elastic.py"), str(self.out), str(EPOCHS), str(STEPS)]
        env = dict(os.environ, PYTHONPATH=str(ROOT / "shim"), OMP_NUM_THREADS="1", TF_NUM_INTEROP_THREADS="1",
                   TF_NUM_INTRAOP_THREADS="1", APPLIANCE_DISCOVERY_INTERVAL="0.2", APPLIANCE_STOP_GRACE="1",
                   APPLIANCE_VIEW="off", TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
        env.pop("TF_USE_LEGACY_KERAS", None)
        if legacy:
            env["TF_USE_LEGACY_KERAS"] = "1"
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
        self.output = open(self.out / "launcher.txt", "wb")
        self.proc = subprocess.Popen(argv, stdout=self.output, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, cwd=self.out)
        return self

    def check_survivor(self, sizes: dict[int, int], resets: list[int]) -> None:
        """Worker 0 ran the whole job in one process, logged each batch at its epoch and the
        batches done in it, was reset at each change of size and ends with the replay's model."""
        assert sorted(sizes) == list(range(1, EPOCHS * STEPS + 1)), sizes
        log = self.log()
        assert [(r["epoch"], r["batch"]) for r in log["0"]] == [((s - 1) // STEPS, (s - 1) % STEPS + 1)
                                                                 for s in sorted(sizes)], log["0"]
        done = self.done()
        assert set(done) == {"0"}, done.keys()
        d = done["0"]
        pid = int((self.out / "pid.0").read_text())
        assert d["pid"] == pid and {r["pid"] for r in log["0"]} == {pid}, (pid, d["pid"])
        assert d["resets"] == resets and (d["epoch"], d["batch"]) == (EPOCHS, 0), d
        assert d["sizes"] == [sizes[s] for s in sorted(sizes)], (d["sizes"], sizes)
        for got, ref in zip(d["params"], d["replay"], strict=True):
            assert len(got) == len(ref) and all(math.isclose(g, r, rel_tol=1e-4, abs_tol=1e-5)
                                                for g, r in zip(got, ref)), (got[:3], ref[:3])
        assert self.leftovers() == []


def test_tf_keras_elastic_fit_survives_a_rank_killed_mid_epoch_from_the_last_commit(tmp_path, tf_keras_installed):
    with KerasJob(tmp_path, f"{A}:1,{B}:1") as job:
        (tmp_path / "kill.1").write_text(str(KILL))
        job.start(["appliance", "launch", "-np", "2", "--min-np", "1", "--max-np", "2"], legacy=True)
        assert job.wait(180) == 0, job.tail()
        sizes = job.check_equal()
        assert [sizes[s] for s in sorted(sizes)] == [2] * (KILL - 1) + [1] * (EPOCHS * STEPS - KILL + 1), sizes
        job.check_survivor(sizes, resets=[1])


def test_keras3_elastic_fit_grows_when_a_host_appears_then_survives_the_new_rank_killed(tmp_path):
    with KerasJob(tmp_path, f"{A}:1") as job:
        (tmp_path / "grow.0").write_text(str(GROW))
        (tmp_path / "kill.1").write_text(str(KILL))
        job.start(["horovodrun", "-np", "1", "--min-np", "1", "--max-np", "2"])
        job.steps(1, n=GROW - 1, limit=120)  # step GROW - 1 done: the growth comes at step GROW
        job.set_hosts(f"{A}:1,{B}:1")  # worker 0 holds as step GROW begins until the launcher's notice arrives
        assert job.wait(180) == 0, job.tail()
        sizes = job.check_equal()
        want = [1] * (GROW - 1) + [2] * (KILL - GROW) + [1] * (EPOCHS * STEPS - KILL + 1)
        assert [sizes[s] for s in sorted(sizes)] == want, sizes
        job.check_survivor(sizes, resets=[2, 1])
