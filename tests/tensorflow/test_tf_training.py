"""A training step with appliance.tensorflow on real ranks: eagerly (DistributedGradientTape),
inside tf.function and in a tf.compat.v1 session (DistributedOptimizer, BroadcastGlobalVariablesHook)
it gives the numbers of one process on every rank's rows; a step's gradients are planned in one
round and fused; an eager allreduce takes the host path or the op's and both pair up. Needs TensorFlow (conftest.py)."""
import pytest



@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("np_", [2, 3])
def test_same_numbers_eager_function_and_session(run_ranks, np_):
    ranks = run_ranks(np_, "tf_hvd", "training", env={"OMP_NUM_THREADS": "1"}, timeout=240)
    for r in range(np_):
        assert ranks[r]["ok"], ranks[r]
    print(f"max |w - one-process w| after 3 steps, {np_} ranks:", ranks[0]["max_abs_error"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_steps_gradients_fuse_in_one_round_and_eager_ops_take_either_path(run_ranks):
    ranks = run_ranks(2, "tf_hvd", "fusion,eager_paths", env={"OMP_NUM_THREADS": "1"}, timeout=240)
    for r in range(2):
        rounds = ranks[r]["fusion_rounds"]
        total = {k: sum(x[k] for x in rounds) for k in rounds[0]}
        # 3 steps of 12 gradients: one plan and one fused entry per step (the counters are read
        # as the step's ops complete, so one may land in the neighbouring step's reading: +1)
        assert total["tensors"] == 36, rounds
        assert total["plans"] <= 4 and total["entries"] <= 4 and total["fused_entries"] >= 3, rounds
        assert ranks[r]["eager_paths"], ranks[r]  # tests/ranks/_tf_eager.py
