"""A deadlock is named within seconds, over real ranks (processes, sockets): when every rank of a
group is blocked waiting on collectives that can never match (another operation, another name,
another order; within one process set while another set goes on; a joined rank; either
negotiation protocol), every rank fails within APPLIANCE_DEADLOCK_SECONDS (DEADLOCK_S here, 2 s,
tightened from the default 5 s so the cases take seconds) plus a little, bounded at BOUND_S from
the last rank blocking and not before 0.8 of it, and prints one line per deadlocked rank naming
what it waits on. A rank that is only slow (a checkpoint, a step while the others wait on
asynchronous handles, twice the deadlock time) is not in a wait, so it never trips the check.
Ranks are started directly (rank_group.RankGroup), bodies in tests/ranks/deadlock_worker.py; each
case bounds its own time and RankGroup kills every rank on the way out.
"""
import pytest

from fixtures import RANKS
from rank_group import RankGroup

WORKER = RANKS / "deadlock_worker.py"
DEADLOCK_S = 2.0
BOUND_S = DEADLOCK_S + 5.0
SLOW_S = 2 * DEADLOCK_S


def _run(tmp_path, np_, case, env=None, timeout=60):
    env = {"APPLIANCE_DEADLOCK_SECONDS": str(DEADLOCK_S), "APPLIANCE_TEST_SLOW_S": str(SLOW_S), **(env or {})}
    with RankGroup(np_, case, out=tmp_path, env=env, worker=WORKER) as g:
        rcs = g.wait(timeout=timeout)
        reports = [g.report(r) for r in range(np_)]
        stderr = [g.stderr(r) for r in range(np_)]
        everything = g.all_stderr()
    return rcs, reports, stderr, everything


def _named(np_, rcs, reports, stderr, everything, waits):
    """Every rank failed with the deadlock, named each rank's waits, within BOUND_S of the last
    rank blocking; returns that time."""
    assert rcs == [3] * np_, f"exit codes {rcs}\n{everything}"
    for r, rep in enumerate(reports):
        assert rep["code"] == "stalled" and "deadlock" in rep["error"], (r, rep)
        for line in waits:
            assert line in rep["error"], (r, line, rep["error"])
            assert f"deadlock:   {line}" in stderr[r], f"rank {r} did not print {line!r}\n{stderr[r]}"
    took = max(rep["at"] for rep in reports) - max(rep["blocked_at"] for rep in reports)
    assert 0.8 * DEADLOCK_S <= took <= BOUND_S, f"named {took:.1f} s after the last rank blocked\n{everything}"
    return took


@pytest.mark.parametrize("np_", [2, 3])
def test_an_allreduce_against_a_broadcast_of_another_name_fails_every_rank_within_seconds(tmp_path, np_):
    waits = ["rank 0 waits on: allreduce 'grads'"] + [f"rank {r} waits on: broadcast 'state' (root 0)"
                                                      for r in range(1, np_)]
    _named(np_, *_run(tmp_path, np_, "names"), waits)


def test_the_star_negotiation_names_a_deadlock_too(tmp_path):
    waits = ["rank 0 waits on: allreduce 'grads'", "rank 2 waits on: broadcast 'state' (root 0)"]
    _named(3, *_run(tmp_path, 3, "names", env={"APPLIANCE_NEGOTIATION": "star"}), waits)


def test_a_joined_rank_waits_on_the_join(tmp_path):
    waits = ["rank 0 waits on: join", "rank 1 waits on: allreduce 'a'", "rank 2 waits on: allreduce 'b'"]
    _named(3, *_run(tmp_path, 3, "join"), waits)


@pytest.mark.parametrize("np_", [2, 3])
def test_the_same_names_in_different_orders_fail_every_rank_within_seconds(tmp_path, np_):
    waits = ["rank 0 waits on: allreduce 'a'"] + [f"rank {r} waits on: allreduce 'b'" for r in range(1, np_)]
    _named(np_, *_run(tmp_path, np_, "order"), waits)


def test_an_allreduce_against_a_broadcast_of_one_name_is_a_mismatch_at_once(tmp_path):
    rcs, reports, _, everything = _run(tmp_path, 2, "same_name")
    assert rcs == [4, 4], f"exit codes {rcs}\n{everything}"
    for rep in reports:
        assert rep["code"] == "mismatch" and "'x'" in rep["error"], rep
        assert rep["at"] - rep["blocked_at"] < 3.0, rep


def test_a_mismatch_within_a_process_set_fails_the_job_while_the_other_set_goes_on(tmp_path):
    # 3 s: set 2 has time for its 20 steps before the abort
    rcs, reports, stderr, everything = _run(tmp_path, 4, "sets", env={"APPLIANCE_DEADLOCK_SECONDS": "3"})
    assert rcs == [3] * 4, f"exit codes {rcs}\n{everything}"
    waits = ["rank 0 waits on: allreduce 'ps1/a' in process set 1", "rank 1 waits on: allreduce 'ps1/b' in process set 1"]
    for r, rep in enumerate(reports):
        assert rep["code"] == "stalled" and "deadlock" in rep["error"], (r, rep)
        for line in waits:
            # Every rank's error names every rank's waits. The separate 'deadlock:   rank R waits on'
            # lines reach the set's own ranks; rank 3 hears of them through rank 2 in the tree, and the
            # ABORT, sent to every rank at once, may overtake them there: its failure line names them.
            printed = f"deadlock:   {line}" if r in (0, 1) else line
            assert line in rep["error"] and printed in stderr[r], (r, line, rep["error"])
        assert "rank 2 waits" not in rep["error"], rep["error"]
    assert min(reports[r]["steps"] for r in (2, 3)) > 20, [rep["steps"] for rep in reports]  # set 2 went on
    took = max(rep["at"] for rep in reports) - max(reports[r]["blocked_at"] for r in (0, 1))
    assert took <= 3 + 5.0, f"named {took:.1f} s after the last rank of set 1 blocked\n{everything}"


@pytest.mark.parametrize("case", ["checkpoint", "long_step"])
def test_a_slow_rank_is_not_a_deadlock(tmp_path, case):
    rcs, reports, stderr, everything = _run(tmp_path, 3, case, timeout=60)
    assert rcs == [0] * 3, f"exit codes {rcs}\n{everything}"
    for r, rep in enumerate(reports):
        assert rep["error"] is None and rep["steps"] > 0, (r, rep)
        assert "deadlock" not in stderr[r], stderr[r]
