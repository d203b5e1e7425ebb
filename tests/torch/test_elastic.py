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


@pytest.mark.timeout(180)
def test_an_elastic_run_that_loses_and_regains_a_host_matches_a_replay_of_its_sizes(tmp_path):
    """A real elastic job (launcher, driver, torch workers): the second host's worker is SIGKILLed
    at step 7 (commits every 3 steps), the host is blacklisted for about a second, discovery brings
    it back and a new worker joins. The final model equals, within float tolerance, a one-process
    replay of the same sequence of sizes from the same commits: no committed step lost or doubled."""
    import json
    import sys
    import torch

    from appliance.launcher import launch

    from fixtures import RANKS as workers

    sys.path.insert(0, str(workers))
    import elastic_torch

    out = tmp_path / "out"
    out.mkdir()
    (out / "hosts").write_text("127.0.0.2:1\n127.0.0.3:1\n")
    script = out / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {out / 'hosts'}\n")
    script.chmod(0o755)
    (out / "kill.1").write_text("7")
    result = launch([sys.executable, str(workers / "elastic_torch.py"), str(out), "60", "3", "0.15"], 2,
                    min_np=1, host_discovery_script=str(script), blacklist_cooldown_range=(1, 1), timeout=150,
                    env={"OMP_NUM_THREADS": "1", "APPLIANCE_DISCOVERY_INTERVAL": "0.2"})
    assert result.returncode == 0, result.reason + "\n" + result.output(stream="stderr")[-3000:]
    got = json.loads((out / "result.json").read_text())
    sizes = got["sizes"]
    assert len(sizes) == 60 and sizes[:6] == [2] * 6 and 1 in sizes and sizes[-1] == 2, sizes
    assert (out / "pid.2").exists()  # the returned host got a new worker; worker 0 was never restarted
    reference = elastic_torch.replay(sizes)
    for p, ref in zip(got["params"], reference.parameters()):
        assert torch.allclose(torch.tensor(p), ref.detach().flatten(), rtol=1e-4, atol=1e-5), (p[:4], ref.flatten()[:4])
    # and the sizes matter: a replay at a constant size gives another model
    other = elastic_torch.replay([2] * 60)
    assert not all(torch.allclose(torch.tensor(p), o.detach().flatten(), atol=1e-5)
                   for p, o in zip(got["params"], other.parameters()))
