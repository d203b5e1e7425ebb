"""appliance.tensorflow's collectives on real ranks (2 and 3 processes through the launcher):
every op (reducescatter, alltoall and join on fewer dtypes) x dtype x a few shapes eagerly and inside tf.function against numpy, grouped allreduce,
IndexedSlices, the scalar ops, the gradients, a process set of the even ranks, a shape mismatch and an unsupported dtype, and
calls before hvd.init(). Needs TensorFlow (conftest.py)."""
import os

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


@pytest.mark.timeout(240)
def test_what_horovods_suite_needs(run_ranks):
    """uint16 through allgather/broadcast/alltoall, grouped allgather and grouped reducescatter
    (values, scaling, gradients, a scalar member refused), and in a v1 session broadcast_ of
    reference and resource variables and the object helpers; Horovod's module paths; an op on a
    process set this rank is not in: InvalidArgumentError when it runs."""
    from fixtures import ROOT

    ranks = run_ranks(2, "tf_hvd", "horovod_suite", timeout=180,
                      env={"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'shim'}",
                           "HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    for r in range(2):
        assert ranks[r]["ok"] and ranks[r]["cases"] == ["horovod_suite"], ranks[r]
