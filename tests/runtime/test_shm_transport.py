"""The shared-memory transport between ranks of one machine, end to end: real ranks started
by the launcher, real segments in /dev/shm, the doorbell sockets.

Covers: which transport each pair gets (shm by default on one machine, TCP with
APPLIANCE_SHM=0) and a large allreduce over it at 2, 3 and 4 ranks; every op x dtype x size
at 2, 3, 4 and 8 ranks with shm off and at 4 and 8 with it on (the engine tests run 2 and 3
with it on); a killed rank named on every survivor
within seconds over shm links; no segment left in /dev/shm after a job, whether it ended
well or with a killed rank; a new link's rings mapped whole, so their first lap takes no page
faults (the test-only extension, two processes). The collectives over shm links against numpy, the corrupt
frame and the dying peer at the link level run in test_dataplane_*.py.
"""
import os
from pathlib import Path

import pytest

SMALL_CHUNKS = {"APPLIANCE_CHUNK_BYTES": "4096"}


def segments() -> set:
    return {p.name for p in Path("/dev/shm").glob("appliance.*")}


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_ranks_of_one_machine_talk_over_shared_memory(run_ranks, np_):
    before = segments()
    ranks = run_ranks(np_, "engine", "links", timeout=120)
    for r in range(np_):
        assert ranks[r]["ok"]
        assert ranks[r]["links"] == ["self" if p == r else "shm" for p in range(np_)], ranks[r]["links"]
    assert segments() <= before, "segments left behind in /dev/shm"


def test_shm_off_means_tcp_for_every_pair(run_ranks):
    ranks = run_ranks(3, "engine", "links", env={"APPLIANCE_SHM": "0"}, timeout=120)
    for r in range(3):
        assert ranks[r]["links"] == ["self" if p == r else "tcp" for p in range(3)]


@pytest.mark.parametrize("np_", [2, 3, 4, 8])
def test_every_op_dtype_and_size_over_tcp(run_ranks, np_):
    ranks = run_ranks(np_, "engine", "ops", env={**SMALL_CHUNKS, "APPLIANCE_SHM": "0"}, timeout=180)
    assert all(ranks[r]["ok"] and ranks[r]["checked"] > 100 for r in range(np_))


@pytest.mark.parametrize("np_", [4, 8])
def test_every_op_dtype_and_size_over_shm(run_ranks, np_):
    """Four ranks, and eight: the control tree three levels deep, links opened on first use by
    every algorithm (ring, doubling, broadcast trees from every root, alltoall)."""
    ranks = run_ranks(np_, "engine", "ops", env=SMALL_CHUNKS, timeout=180)
    assert all(ranks[r]["ok"] and ranks[r]["checked"] > 100 for r in range(np_))


@pytest.mark.parametrize("shm", ["1", "0"])
def test_killed_rank_mid_collective_is_named_and_leaves_no_segment(run_ranks, tmp_path, shm):
    before = segments()
    victim = 2
    ranks = run_ranks(3, "engine", "die", victim, "collective", env={"APPLIANCE_SHM": shm}, expect_ok=False,
                      timeout=60)
    died_at = float(next(tmp_path.glob("reports-*/victim_died_at")).read_text())
    for r in (0, 1):
        rep = ranks[r]
        assert rep is not None and rep["error"], f"rank {r}:\n" + ranks.output()[-3000:]
        assert rep["origin_rank"] == victim and f"rank {victim}" in rep["error"], rep
        assert rep["at"] - died_at < 5.0, f"rank {r} took {rep['at'] - died_at:.1f}s to notice"
    assert segments() <= before


def test_a_new_links_first_lap_of_its_rings_takes_no_page_faults():
    # Two processes on two cpus over a fresh shm link pair, 300 exchanges of 4 KiB each way:
    # more than a lap of the 1 MiB data ring. The rings are mapped whole when the segment is
    # mapped, so the process that mapped it takes no page fault in them (else about two per
    # exchange until the first lap ends: its outgoing and its incoming page).
    from appliance.runtime import _core_testing as T

    cpus = sorted(os.sched_getaffinity(0))
    res = T.shm_hops("op1", "spin", 4096, 300, warmup=0, cpus=[cpus[0], cpus[-1]])
    # Unpopulated rings take about 2 x 256 = 512 faults in this loop; the rest of the process (its
    # stack, its heap, the loop's own first touches) takes a few dozen that vary with the machine.
    assert res["a"]["phases"]["minflt"] < 100, res["a"]["phases"]
