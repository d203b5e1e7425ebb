"""``import horovod.keras as hvd`` with Keras 3 on ``KERAS_BACKEND=torch``, 2 real ranks, each with
its own rows and initial weights (tests/ranks/keras_torch.py): ``fit`` with ``DistributedOptimizer``
and the broadcast callback leaves both ranks with the weights of one process trained on both
ranks' rows of each step (the gradients, torch tensors, averaged through the runtime's numpy
API); the epoch's loss is the ranks' average; an option that path lacks (fp16 compression) is
refused by name, and so is a Keras 3 backend with no averaging path (jax). Needs TensorFlow (conftest.py) and torch."""
from __future__ import annotations

import os

import numpy as np
import pytest

from fixtures import RANKS, ROOT

PATH = os.pathsep.join([str(ROOT), str(ROOT / "shim"), str(RANKS)])


@pytest.mark.timeout(180)
def test_keras3_on_torch_averages_like_one_process(run_ranks):
    pytest.importorskip("torch")
    ranks = run_ranks(2, "keras_torch", env={"PYTHONPATH": PATH, "OMP_NUM_THREADS": "1", "KERAS_BACKEND": "torch"},
                      timeout=150)
    reps = [ranks[0], ranks[1]]
    for r, rep in enumerate(reps):
        assert rep and rep["ok"] and rep["backend"] == "torch", (r, rep)
        assert np.allclose(rep["weights"], rep["reference"], atol=1e-5), (r, rep["weights"][:3], rep["reference"][:3])
        assert "compression" in (rep["fp16_error"] or ""), rep["fp16_error"]
        assert "KERAS_BACKEND=jax" in (rep["jax_error"] or ""), rep["jax_error"]
    raw = np.array([rep["raw_loss"] for rep in reps])
    assert not np.allclose(raw[0], raw[1])
    for rep in reps:
        assert np.allclose(rep["history_loss"], raw.mean(axis=0), rtol=1e-6), (rep["history_loss"], raw.tolist())
