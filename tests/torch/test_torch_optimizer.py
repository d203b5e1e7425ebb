"""DistributedOptimizer on real ranks: P ranks with batch B/P end with the parameters of one
process with batch B after 20 SGD steps (1e-5; fp16 compression 1e-3), in every variant
(backward_passes_per_step=2, groups, predivide, skip_synchronize + clipping, sparse), plus
Horovod's guards and errors. Also as one plain process."""
import pytest

from _torch_single import run_single

CASES = "equivalence,optimizer_behaviour"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("np_", [2, 3])
def test_distributed_optimizer(run_ranks, np_):
    ranks = run_ranks(np_, "torch_hvd", CASES, env={"OMP_NUM_THREADS": "1"}, timeout=240)
    for r in range(np_):
        assert ranks[r]["ok"] and ranks[r]["cases"] == CASES.split(","), ranks[r]
    print(f"max |param - one-process param| after 20 steps, {np_} ranks:", ranks[0]["max_abs_error"])


@pytest.mark.timeout(200)
def test_single_rank_without_launcher(tmp_path):
    run_single(tmp_path, CASES)
