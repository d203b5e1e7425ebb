"""Elastic Keras 3 ``fit`` in a real elastic job on this machine: ``appliance launch`` with a host
discovery script and loopback hosts (``fixtures.elastic_grow.GrowJob``, as tests/tensorflow/
test_tf_elastic.py uses it), the rank program ``tests/ranks/keras_elastic.py`` (``hvd.elastic.run``
around ``model.fit`` with ``KerasState`` and the Commit/UpdateBatch/UpdateEpoch callbacks).

Asserted effects: two ranks train; one is SIGKILLed as a batch in the middle of an epoch begins;
the other survives in the same process (its PID never changes), is reset once to size 1, resumes
``fit`` from the last commit with the epoch shortened by the batches already done, and ends after
exactly EPOCHS x STEPS batches: every global step taken once per rank by as many ranks as the job
had then, each logged at its epoch and batch, the killed step taken again alone, and the final
model equal to a one-process replay of those sizes (no committed batch lost or doubled); rc 0 and
no process left. Needs TensorFlow (conftest.py); pytest itself never imports it.
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


class KerasJob(GrowJob):
    """A GrowJob of ``tests/ranks/keras_elastic.py`` (a fixed number of epochs: no stop file)."""

    def start(self, cli: list[str], **_) -> "KerasJob":
        bin_dir = Path(sys.executable).parent
        argv = [str(bin_dir / cli[0]), *cli[1:], "--host-discovery-script", str(self.script),
                sys.executable, str(RANKS / "keras_elastic.py"), str(self.out), str(EPOCHS), str(STEPS)]
        env = dict(os.environ, PYTHONPATH=str(ROOT / "shim"), OMP_NUM_THREADS="1", TF_NUM_INTEROP_THREADS="1",
                   TF_NUM_INTRAOP_THREADS="1", APPLIANCE_DISCOVERY_INTERVAL="0.2", APPLIANCE_STOP_GRACE="1",
                   APPLIANCE_VIEW="off", TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
        env.pop("TF_USE_LEGACY_KERAS", None)
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
        self.output = open(self.out / "launcher.txt", "wb")
        self.proc = subprocess.Popen(argv, stdout=self.output, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, cwd=self.out)
        return self


def test_elastic_fit_survives_a_rank_killed_mid_epoch_from_the_last_commit(tmp_path):
    with KerasJob(tmp_path, "127.0.0.2:1,127.0.0.3:1") as job:
        (tmp_path / "kill.1").write_text(str(KILL))
        job.start(["appliance", "launch", "-np", "2", "--min-np", "1", "--max-np", "2"])
        assert job.wait(180) == 0, job.tail()
        sizes = job.check_equal()
        assert sorted(sizes) == list(range(1, EPOCHS * STEPS + 1)), sizes
        assert [sizes[s] for s in sorted(sizes)] == [2] * (KILL - 1) + [1] * (EPOCHS * STEPS - KILL + 1), sizes
        log = job.log()
        # each batch logged at its epoch and the batches done in it (the survivor's first epoch after the reset shortened)
        assert [(r["epoch"], r["batch"]) for r in log["0"]] == [((s - 1) // STEPS, (s - 1) % STEPS + 1)
                                                                 for s in sorted(sizes)], log["0"]
        done = job.done()
        assert set(done) == {"0"}, done.keys()
        d = done["0"]
        pid = int((tmp_path / "pid.0").read_text())
        assert d["pid"] == pid and {r["pid"] for r in log["0"]} == {pid}, (pid, d["pid"])
        assert d["resets"] == [1] and (d["epoch"], d["batch"]) == (EPOCHS, 0), d
        assert d["sizes"] == [sizes[s] for s in sorted(sizes)], (d["sizes"], sizes)
        for got, ref in zip(d["params"], d["replay"], strict=True):
            assert len(got) == len(ref) and all(math.isclose(g, r, rel_tol=1e-4, abs_tol=1e-5)
                                                for g, r in zip(got, ref)), (got[:3], ref[:3])
        assert job.leftovers() == []
