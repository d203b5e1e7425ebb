"""``hvd.elastic`` on real ranks (tests/ranks/elastic_worker.py), at 2 and 3 ranks: commit and
restore of a TorchState (model, optimizer, counters) when HorovodInternalError is raised inside
``hvd.elastic.run``; a host-set notification on rank 0 interrupting every rank's commit, the reset
(re-initialised runtime, reset callbacks) and the re-run with and without sync; ObjectState and
TorchState synced from rank 0; ElasticSampler's partition and its recorded batches skipped after a
restore; and a rank that really dies: the others leave ``run`` with HorovodInternalError naming
it, their state back at the last commit."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

CASES = "restore,hosts_updated,object_sync,sampler"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np_", [2, 3])
def test_elastic_state_run_and_sampler(run_ranks, np_):
    ranks = run_ranks(np_, "elastic_worker", CASES, env={"OMP_NUM_THREADS": "1"}, timeout=150)
    for r in range(np_):
        rep = ranks[r]
        assert rep["ok"] and rep["size"] == np_ and rep["cases"] == CASES.split(","), rep
        assert rep["restore_batch"] == 3
        assert rep["hosts_updated"] == {"added": ["start", "rank0"], "removed": ["start", f"rank{r}"]}, rep


@pytest.mark.timeout(150)
@pytest.mark.parametrize("np_", [2, 3])
def test_lost_rank_leaves_run_with_horovod_internal_error_and_restored_state(run_ranks, np_):
    victim = np_ - 1
    ranks = run_ranks(np_, "elastic_worker", "lost_rank", env={"OMP_NUM_THREADS": "1"}, timeout=90,
                      expect_ok=False)
    assert ranks.result.returncode != 0, "the job did not fail although a rank was lost"
    assert ranks[victim] is None
    for r in range(victim):
        rep = ranks[r]
        assert rep is not None, f"rank {r} did not report:\n" + ranks.output()[-3000:]
        assert rep["ok"] and rep["cases"] == ["lost_rank"], rep
        assert rep["error"] and rep["origin_rank"] == victim, rep
        assert rep["batch"] == 3, rep  # the state is back at the commit, not at step 5
