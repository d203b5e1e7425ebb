"""DistributedOptimizer on real ranks: P ranks with batch B/P end with the parameters of one
process with batch B after 20 SGD steps (1e-5; fp16 compression 5e-3), in every variant
(backward_passes_per_step=2, groups, predivide, skip_synchronize + clipping, sparse), plus
Horovod's guards and errors."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_spawn import run_workers  # noqa: E402


@pytest.mark.timeout(300)
@pytest.mark.parametrize("np_", [0, 2, 3])
def test_distributed_optimizer(np_):
    outs = run_workers(np_, "equivalence,optimizer_behaviour", timeout=240)
    n = max(np_, 1)
    assert [o.strip().splitlines()[-1] for o in outs] == [f"OK {r}/{n}" for r in range(n)]
