"""``horovod.tensorflow.keras`` on real ranks, each with its own rows: Keras 3 at 3 ranks, tf-keras
(``TF_USE_LEGACY_KERAS=1``) at 2, one launch each (tests/ranks/keras_hvd.py): ``fit`` with
``DistributedOptimizer`` leaves every rank with the same weights, those of one process trained
on every rank's rows of each step; the epoch's metrics are the ranks' average; the warmup and
schedule callbacks give Horovod's learning rate batch by batch, with momentum correction; the best-model checkpoint is
written by rank 0 only and ``load_model`` restores it with a wrapped optimizer; gradients handed
to ``apply_gradients``/``apply`` directly (eager, tf.function, fp16, sparse, two passes per step)
are averaged; a step's gradients reach the runtime together (one plan); a Keras 3 step under XLA is refused
naming jit_compile=False; ``SyncBatchNormalization`` trained one ``fit`` step on masked batches of
different sizes holds the concatenated batch's moving mean and variance. Needs TensorFlow
(conftest.py)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from fixtures import RANKS, ROOT

PATH = os.pathsep.join([str(ROOT), str(ROOT / "shim"), str(RANKS)])


def expected_lrs(size: int, initial: float, spe: int) -> list[float]:
    """Horovod's schedule: warmup over epochs 0-1 (per batch), x0.5 per epoch in 2-3, 0.01 * epoch in 4."""
    out = []
    for epoch in range(5):
        for batch in range(spe):
            if epoch < 2:
                e = epoch + batch / spe + 1 / spe
                out.append(initial / size * (e * (size - 1) / 2 + 1))
            elif epoch < 4:
                out.append(initial * 0.5 ** (epoch - 2))
            else:
                out.append(initial * 0.01 * epoch)
    return out


def check(ranks, size: int) -> None:
    """Every failed expectation, named (so one run with several features broken shows each)."""
    reps = [ranks[r] for r in range(size)]
    for r, rep in enumerate(reps):
        assert rep and rep["ok"], (r, rep)
    bad = []
    w0 = np.array(reps[0]["weights"])
    for r, rep in enumerate(reps):
        # equal on every rank, and equal to one process on every rank's rows (from root's initial weights)
        if not np.allclose(rep["weights"], w0, atol=1e-6):
            bad.append(f"rank {r}'s weights differ from rank 0's: gradients not averaged")
        if not np.allclose(rep["weights"], rep["reference"], atol=1e-5):
            bad.append(f"rank {r}: max |w - one-process w| = {np.abs(np.array(rep['weights']) - rep['reference']).max()}")
    raw = np.array([rep["raw_loss"] for rep in reps])
    if np.allclose(raw[0], raw[1]):
        bad.append("the ranks' own losses should differ (their own rows)")
    for r, rep in enumerate(reps):
        if not np.allclose(rep["history_loss"], raw.mean(axis=0), rtol=1e-6):
            bad.append(f"rank {r}: history loss {rep['history_loss']} is not the ranks' mean of {raw.tolist()}")
        want = expected_lrs(size, rep["initial_lr"], rep["steps_per_epoch"])
        if not np.allclose(rep["lrs"], want, rtol=1e-6):
            bad.append(f"rank {r}: learning rates {rep['lrs']} != Horovod's {want}")
        if not rep["momentum_corrected"]:
            bad.append(f"rank {r}: momentum correction missing when the rate halves")
        if rep["loaded_iterations"] != rep["trained_iterations"] or rep["trained_iterations"] <= 0:
            bad.append(f"rank {r}: load_model restored {rep['loaded_iterations']} of {rep['trained_iterations']} iterations")
        if not np.allclose(rep["loaded_weights"], reps[0]["loaded_weights"], atol=1e-6):
            bad.append(f"rank {r}: weights differ after training the loaded model")
        rounds = rep["fusion_rounds"]
        total = {k: sum(x[k] for x in rounds) for k in rounds[0]}
        # 3 steps of 6 gradients, one plan each (a counter read as the ops complete may land in the neighbouring step: +1)
        if total["tensors"] != 3 * rep["fusion_gradients"] or total["plans"] > 4:
            bad.append(f"rank {r}: a step's gradients did not go together: {rounds}")
        bn = rep["sync_bn"]
        if not np.allclose(bn["moving"], bn["reference"], atol=1e-5):
            bad.append(f"rank {r}: SyncBatchNormalization's moving mean/variance {bn['moving']} != the concatenated "
                       f"batch's {bn['reference']}")
        if not np.allclose(bn["weights"], reps[0]["sync_bn"]["weights"], atol=1e-6):
            bad.append(f"rank {r}: weights differ after a step through SyncBatchNormalization")
    if not reps[0]["legacy"] and "jit_compile=False" not in (reps[0]["xla_error"] or ""):
        bad.append(f"a Keras 3 step under XLA: {reps[0]['xla_error']!r} (the error naming jit_compile=False expected)")
    if [rep["checkpoint_written"] for rep in reps] != [True] + [False] * (size - 1):
        bad.append(f"checkpoints written: {[rep['checkpoint_written'] for rep in reps]} (rank 0 only expected)")
    print("seconds per case (rank 0):", reps[0]["seconds"], "fusion:", reps[0]["fusion_rounds"])
    assert not bad, "\n".join(bad)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_keras3_fit_averages_like_one_process(run_ranks):
    ranks = run_ranks(3, "keras_hvd", env={"PYTHONPATH": PATH, "OMP_NUM_THREADS": "1"}, timeout=200)
    assert ranks[0]["legacy"] is False
    check(ranks, 3)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_tf_keras_fit_averages_like_one_process(run_ranks, tf_keras_installed):
    ranks = run_ranks(2, "keras_hvd", env={"PYTHONPATH": PATH, "OMP_NUM_THREADS": "1", "TF_USE_LEGACY_KERAS": "1"},
                      timeout=200)
    assert ranks[0]["legacy"] is True
    check(ranks, 2)
