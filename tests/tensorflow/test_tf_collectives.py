"""appliance.tensorflow's collectives on real ranks (2 and 3 processes through the launcher):
every op (reducescatter, alltoall and join on fewer dtypes) x dtype x a few shapes eagerly and inside tf.function against numpy, grouped allreduce,
IndexedSlices, the scalar ops, the gradients, a process set of the even ranks, a shape mismatch and an unsupported dtype, and
calls before hvd.init(). Needs TensorFlow (conftest.py)."""
import pytest


CASES = (
    "before_init,allreduce,grouped_allreduce,allgather,broadcast,reducescatter,alltoall,join,indexed_slices,scalars,"
    "gradients,errors")


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("np_", [2, 3])
def test_collectives(run_ranks, np_):
    ranks = run_ranks(np_, "tf_hvd", CASES, env={"OMP_NUM_THREADS": "1"}, timeout=360)
    for r in range(np_):
        assert ranks[r]["ok"] and ranks[r]["cases"] == CASES.split(","), ranks[r]
        assert ranks[r]["allreduce_checked"] >= 280, ranks[r]


@pytest.mark.timeout(300)
def test_process_sets(run_ranks):
    ranks = run_ranks(3, "tf_hvd", "process_sets", env={"OMP_NUM_THREADS": "1", "HOROVOD_DYNAMIC_PROCESS_SETS": "1"},
                      timeout=240)
    for r in range(3):
        assert ranks[r]["ok"] and ranks[r]["cases"] == ["process_sets"], ranks[r]
