"""``hvd.SyncBatchNorm`` on real ranks (tests/ranks/sync_bn.py): output, running statistics and
input/weight/bias gradients equal ``torch.nn.BatchNorm*d`` on the concatenated batch of every rank,
with a different batch size on each rank (one of them empty), for (N, C), (N, C, L), (N, C, H, W)
and (N, C, D, H, W) input; eval mode; ``momentum=None``; two layers; a DistributedOptimizer step;
and a lone rank without a launcher (plain batch norm)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from fixtures import RANKS, ROOT

CASES = ["train_shapes", "options", "no_running_stats", "two_layers", "optimizer_step", "errors"]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np_", [2, 3])
def test_sync_batch_norm_equals_batch_norm_on_the_global_batch(run_ranks, np_):
    ranks = run_ranks(np_, "sync_bn", env={"OMP_NUM_THREADS": "1"}, timeout=150)
    for r in range(np_):
        assert ranks[r]["ok"] and ranks[r]["size"] == np_ and ranks[r]["cases"] == CASES, ranks[r]


@pytest.mark.timeout(150)
def test_sync_batch_norm_on_a_single_rank_without_launcher(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_", "OMPI_"))}
    env.update(APPLIANCE_TEST_OUT=str(tmp_path), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(RANKS / "sync_bn.py")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rep = json.loads((tmp_path / "rank0.json").read_text())
    assert rep["ok"] and rep["size"] == 1 and rep["cases"] == CASES, rep
