"""appliance.torch collectives on real ranks: every op x dtype x size (0, 1, odd, large) against
torch references, in-place/async/grouped variants, argument errors, mismatches, join, and the
gradients of the out-of-place ops (Horovod's backward rules). Also as one plain process."""
import pytest

from _torch_single import run_single

# Small pipeline chunks so the large cases cross many chunks.
ENV = {"APPLIANCE_CHUNK_BYTES": "8192", "OMP_NUM_THREADS": "1"}
COLLECTIVES = "allreduce,grouped,allgather,broadcast,alltoall,reducescatter,misc"


def _all_ok(ranks, np_, cases):
    for r in range(np_):
        assert ranks[r] and ranks[r]["ok"] and ranks[r]["rank"] == r and ranks[r]["size"] == np_, ranks[r]
        assert ranks[r]["cases"] == cases.split(",")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("np_", [2, 3])
def test_collectives(run_ranks, np_):
    _all_ok(run_ranks(np_, "torch_hvd", COLLECTIVES, env=ENV, timeout=300), np_, COLLECTIVES)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np_", [2, 3])
def test_autograd(run_ranks, np_):
    _all_ok(run_ranks(np_, "torch_hvd", "autograd", env=ENV, timeout=150), np_, "autograd")


@pytest.mark.timeout(200)
def test_single_rank_without_launcher(tmp_path):
    run_single(tmp_path, COLLECTIVES + ",autograd", timeout=150, env=ENV)
