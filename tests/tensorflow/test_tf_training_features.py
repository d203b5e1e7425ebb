"""The training features of appliance.tensorflow beyond plain averaging, on 2 real ranks with
per-rank data, each against a one-process reference (tests/ranks/_tf_features.py): local
gradient aggregation (v1 DistributedOptimizer in a session, the eager helper eagerly and in
tf.function), PartialDistributedGradientTape, SyncBatchNormalization (output, input gradient and
moving statistics of the concatenated batch) and Adasum through DistributedGradientTape and the
v1 DistributedOptimizer. One run checks them all (a TensorFlow rank's start is the cost)."""
import pytest


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_aggregation_partial_tape_sync_batch_norm_and_adasum_match_one_process(run_ranks):
    ranks = run_ranks(2, "tf_hvd", "features", env={"OMP_NUM_THREADS": "1"}, timeout=240)
    for r in range(2):
        assert ranks[r]["ok"], ranks[r]
        assert set(ranks[r]["seconds"]) == {"aggregation", "partial_tape", "sync_batch_norm", "adasum"}, ranks[r]
        assert ranks[r]["failures"] == {}, ranks[r]["failures"]
    print("seconds per check (rank 0):", ranks[0]["seconds"])
