"""The engine end to end: real ranks (processes) over real sockets, numpy API.

Covers: every op x dtype x size at 2 and 3 ranks against numpy (and at 2 with callers not
driving the engine); waiting callers driving the engine, from several threads at once;
out-of-order submission;
mismatches raised on every rank with the culprits named, runtime still usable; duplicate
in-flight names; joins; init->shutdown->init; a single rank without a launcher; fusion and the
response cache doing their job; a killed rank named on every survivor within seconds.
"""
import os
import subprocess
import sys
import time

import pytest

from fixtures import RANKS, ROOT

SMALL_CHUNKS = {"APPLIANCE_CHUNK_BYTES": "4096"}


@pytest.mark.parametrize("np_,spin", [(2, "100"), (3, "100"), (2, "0")])
def test_every_op_dtype_and_size(run_ranks, np_, spin):
    ranks = run_ranks(np_, "engine", "ops", env={**SMALL_CHUNKS, "APPLIANCE_SPIN_US": spin}, timeout=120)
    for r in range(np_):
        assert ranks[r]["ok"] and ranks[r]["checked"] > 100
        assert (ranks[r]["local_rank"], ranks[r]["local_size"]) == (r, np_)
        assert (ranks[r]["cross_rank"], ranks[r]["cross_size"]) == (0, 1)


@pytest.mark.parametrize("hier", ["1", "0"])
def test_every_op_on_two_simulated_hosts_hierarchical_or_flat(run_ranks, hier):
    """Four ranks as two hosts of two (HOROVOD_HOSTNAME): hierarchical allreduce and allgather
    forced on (or off) give the flat algorithms' results, every dtype, op and size."""
    env = {**SMALL_CHUNKS, "APPLIANCE_TEST_HOSTS": "2", "HOROVOD_HIERARCHICAL_ALLREDUCE": hier,
           "HOROVOD_HIERARCHICAL_ALLGATHER": hier}
    ranks = run_ranks(4, "engine", "ops", env=env, timeout=180)
    for r in range(4):
        assert ranks[r]["ok"] and ranks[r]["checked"] > 100
        assert (ranks[r]["local_rank"], ranks[r]["local_size"]) == (r % 2, 2)
        assert (ranks[r]["cross_rank"], ranks[r]["cross_size"]) == (r // 2, 2)


def test_out_of_order_submission(run_ranks):
    ranks = run_ranks(3, "engine", "order")
    assert ranks[0]["order"] != ranks[1]["order"] != ranks[2]["order"]
    assert all(ranks[r]["ok"] for r in range(3))


def test_mismatch_raises_on_every_rank_and_names_culprits(run_ranks):
    ranks = run_ranks(3, "engine", "mismatch")
    expect = {
        "shape": ["m.shape", "shape", "[2, 3]", "[2, 4]"],
        "dtype": ["m.dtype", "float32", "float64"],
        "op": ["m.op", "Sum", "Max"],
        "root": ["m.root", "root"],
        "gather": ["m.gather", "[2, 2]", "[2, 3]"],
        "kind": ["m.kind", "allreduce", "allgather"],
        "scale": ["m.scale", "scale"],
    }
    for r in range(3):
        msgs = ranks[r]["messages"]
        for key, words in expect.items():
            assert msgs[key], f"rank {r}: no error for a {key} mismatch"
            for w in words + ["rank 2"]:
                assert w in msgs[key], f"rank {r}: {key}: {w!r} missing from {msgs[key]!r}"
        # the same text on every rank
        assert msgs == ranks[0]["messages"]


def test_duplicate_name_in_flight_is_value_error(run_ranks):
    ranks = run_ranks(2, "engine", "duplicate")
    for r in range(2):
        assert ranks[r]["error"] and f"'dup.{r}'" in ranks[r]["error"] and "in flight" in ranks[r]["error"]


def test_join(run_ranks):
    ranks = run_ranks(3, "engine", "join")
    assert [ranks[r]["last"] for r in range(3)] == [2, 2, 2]


@pytest.mark.parametrize("np_", [2, 5])
def test_init_shutdown_init(run_ranks, np_):
    """Three starts in one process; at 5 ranks the control tree and the links opened on first use
    (a broadcast from the last rank, an allgather) are set up again in each."""
    ranks = run_ranks(np_, "engine", "reinit")
    assert all(ranks[r]["ok"] for r in range(np_))


def test_single_rank_without_launcher(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_", "OMPI_"))}
    env.update(APPLIANCE_TEST_OUT=str(tmp_path), PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, str(RANKS / "engine.py"), "single"], env=env, check=True, timeout=60)
    assert (tmp_path / "rank0.json").exists()


@pytest.mark.parametrize("np_", [2, 3])
def test_large_outputs_recycled_never_while_referenced(run_ranks, np_):
    ranks = run_ranks(np_, "engine", "outputs", timeout=120)
    for r in range(np_):
        assert ranks[r]["ok"] and ranks[r]["in_place"], ranks[r]
        assert ranks[r]["reused"] >= 10, ranks[r]  # most of the 18 later outputs reuse a dropped one's block
        assert 0 < ranks[r]["idle"] <= 256 << 20, ranks[r]


def test_fusion_and_response_cache(run_ranks):
    n = 64
    ranks = run_ranks(2, "engine", "stats", n)
    s1, s2 = ranks[1]["first"], ranks[1]["second"]
    assert s1["tensors"] == n and s2["tensors"] == 2 * n
    assert s1["fused_entries"] >= 1 and s1["entries"] < n, s1  # small tensors were fused
    assert s1["ready_full"] == n and s1["ready_ids"] == 0, s1  # first step: full requests
    assert s2["ready_full"] == n and s2["ready_ids"] == n, s2  # second step: cache ids only
    # The negotiation's CPU time is measured only while profiling is on.
    assert s2["negotiation_ns"] == s2["negotiation_turns"] == 0, s2
    s3 = ranks[1]["profiled"]
    assert s3["negotiation_turns"] > 0 and s3["negotiation_ns"] > 0, s3


@pytest.mark.parametrize("spin", ["20000", "0"])
def test_waiting_callers_drive_the_engine_unless_spinning_is_off(run_ranks, spin):
    n = 200
    # A long spin budget (20 ms) keeps a peer that the scheduler delays (a loaded machine)
    # from ending a drive early: what is tested is who runs the plans, not the budget.
    ranks = run_ranks(2, "engine", "drive", n, env={"APPLIANCE_SPIN_US": spin})
    for r in range(2):
        rep = ranks[r]
        assert rep["ok"], rep
        if spin != "0":
            # A synchronous loop's waits run (nearly) every plan on the caller's thread; a wait
            # that finds its op done, or a peer late for more than APPLIANCE_SPIN_US, does not.
            assert rep["sync_driven"] >= n // 2, rep
        else:
            assert rep["stats"]["driven_plans"] == 0, rep


@pytest.mark.parametrize("np_", [2, 3])
def test_caller_threads_drive_and_wait_side_by_side(run_ranks, np_):
    ranks = run_ranks(np_, "engine", "threads", 400, timeout=120)
    for r in range(np_):
        assert ranks[r]["ok"], ranks[r]["errors"]
        assert ranks[r]["driven"] > 0, ranks[r]


def test_fusion_disabled(run_ranks):
    n = 16
    ranks = run_ranks(2, "engine", "stats", n, env={"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CACHE_CAPACITY": "0"})
    s2 = ranks[1]["second"]
    assert s2["entries"] == 2 * n and s2["fused_entries"] == 0
    assert s2["ready_ids"] == 0 and s2["ready_full"] == 2 * n


@pytest.mark.parametrize("when", ["idle", "collective"])
def test_killed_rank_is_named_on_every_survivor(run_ranks, tmp_path, when):
    victim = 1
    ranks = run_ranks(3, "engine", "die", victim, when, expect_ok=False, timeout=60)
    died_files = list(tmp_path.glob("reports-*/victim_died_at"))
    assert died_files, ranks.output()[-3000:]
    died_at = float(died_files[0].read_text())
    for r in (0, 2):
        rep = ranks[r]
        assert rep is not None, f"rank {r} did not report:\n" + ranks.output()[-3000:]
        assert rep["error"], f"rank {r} saw no error"
        assert rep["origin_rank"] == victim, rep
        assert f"rank {victim}" in rep["error"], rep["error"]
        assert rep["at"] - died_at < 5.0, f"rank {r} took {rep['at'] - died_at:.1f}s to notice"
    assert ranks.result.returncode != 0


def test_one_submit_and_one_wait(run_ranks):
    ranks = run_ranks(2, "engine", "submit_api")
    for r in range(2):
        got = ranks[r]
        assert got["allreduce"] is None and got["allgather"] == ["Result", [3, 2]]
        assert got["group_handles"] == 3 and got["group_wait"] is None
        assert got["gathered_group"] == [[4, 1], [2, 3]] and got["empty_group"] == [[], None]
        assert "(data, dtype, shape" in got["malformed"]
        why, handles, done = got["refused"]
        assert "api.r.1" in why and "negative dimension" in why and len(handles) == 1 and not done
