"""``op=hvd.Adasum`` through ``appliance.torch`` on 2 and 3 real ranks (3: the non-power-of-2
fold): allreduce values against a torch reference of the recursive Adasum, orthogonal inputs
add up, equal inputs give the input, refusals leave the runtime usable, and
``DistributedOptimizer(op=hvd.Adasum)`` matches start + Adasum(local deltas) and trains
(tests/ranks/torch_adasum.py)."""
import pytest


@pytest.mark.timeout(240)
@pytest.mark.parametrize("np_", [2, 3])
def test_adasum_allreduce_and_optimizer(run_ranks, np_):
    ranks = run_ranks(np_, "torch_adasum", env={"OMP_NUM_THREADS": "1"}, timeout=200)
    for r in range(np_):
        assert ranks[r]["ok"] and ranks[r]["size"] == np_, ranks[r]
    losses = ranks[0]["losses"]
    assert losses[-1] < 0.5 * losses[0]
    print(f"Adasum optimizer, {np_} ranks: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
