"""appliance.torch helpers and lifecycle on real ranks: broadcast_parameters, optimizer state,
objects, init -> shutdown -> init, build probes, and a rank that dies."""
import pytest

from _torch_single import run_single

CASES = "functions,probes,lifecycle"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np_", [2, 3])
def test_functions_probes_lifecycle(run_ranks, np_):
    ranks = run_ranks(np_, "torch_hvd", CASES, env={"OMP_NUM_THREADS": "1"}, timeout=150)
    for r in range(np_):
        assert ranks[r]["ok"] and ranks[r]["cases"] == CASES.split(","), ranks[r]


@pytest.mark.timeout(200)
def test_single_rank_without_launcher(tmp_path):
    run_single(tmp_path, CASES)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("np_", [2, 3])
def test_dead_rank_raises_horovod_internal_error_everywhere(run_ranks, tmp_path, np_):
    victim = np_ - 1
    ranks = run_ranks(np_, "torch_hvd", "peer_loss", expect_ok=False, timeout=60)
    died = list(tmp_path.glob("reports-*/victim_died_at"))
    assert died, ranks.output()[-3000:]
    died_at = float(died[0].read_text())
    for r in range(victim):
        rep = ranks[r]
        assert rep is not None, f"rank {r} did not report:\n" + ranks.output()[-3000:]
        assert rep["error"], f"rank {r} saw no error"
        assert rep["origin_rank"] == victim and f"rank {victim}" in rep["error"], (r, rep)
        assert rep["at"] - died_at < 5.0, f"rank {r} took {rep['at'] - died_at:.1f} s to notice"
