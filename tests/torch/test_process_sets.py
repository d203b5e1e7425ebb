"""Process sets (static and dynamic, every collective, DistributedOptimizer, errors) and Horovod's
join rules on real ranks at 2 and 3 ranks: one failed operation fails only that operation."""
import pytest

ENV = {"OMP_NUM_THREADS": "1"}


def _run(run_ranks, np_, cases):
    ranks = run_ranks(np_, "process_sets", cases, env=ENV, timeout=150)
    return [ranks[r] for r in range(np_)]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np_", [2, 3])
def test_static_and_dynamic_sets(run_ranks, np_):
    evens, odds = list(range(0, np_, 2)), list(range(1, np_, 2))
    static, dynamic = _run(run_ranks, np_, "static"), _run(run_ranks, np_, "dynamic")
    for r, (rep, dyn_rep) in enumerate(zip(static, dynamic)):
        st = rep["static"]
        assert st["ids"] == [1, 2, None]  # the repeated set is left unregistered, as in Horovod
        assert st["global"] == [0, np_]
        assert st["sizes"] == [len(evens), len(odds)]
        assert st["ranks_in"] == [evens.index(r) if r in evens else -1, odds.index(r) if r in odds else -1]
        assert st["included"] == [r in evens, r in odds]
        assert st["sum"] == sum(evens if r in evens else odds)
        dyn = dyn_rep["dynamic"]
        assert dyn["ids"] == [1, 2]
        assert dyn["dup"][0] == "ValueError" and "exists already" in dyn["dup"][1]
        for refused in dyn["global_dup"][:1 if np_ > 2 else 2]:  # a set of every rank duplicates the global set
            assert refused[0] == "ValueError" and "the global process set" in refused[1], refused
        assert dyn["removed"] == [True, False] and dyn["global_removed"] is False
        if r in (0, np_ - 1):
            assert dyn["use_removed"][0] == "ValueError" and "not registered" in dyn["use_removed"][1]
        assert dyn["reused_id"] == 1 and dyn["empty_id"] == 3


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np_", [2, 3])
def test_every_collective_on_two_sets_at_once(run_ranks, np_):
    reps = _run(run_ranks, np_, "ops")
    for r, rep in enumerate(reps):
        got = rep["ops"]
        members = list(range(r % 2, np_, 2))
        k, me = len(members), members.index(r)
        assert got["allreduce"] == [float(sum(members))] * 5
        assert got["average"] == pytest.approx([sum(members) / k] * 3)
        assert got["grouped"] == [[float(sum(members))] * 2, [float(k)] * 3]
        assert got["allgather"] == [float(m) for m in members for _ in range(m + 1)]
        assert got["broadcast"] == [float(members[-1])] * 4
        assert got["alltoall"] == [float(10 * m + me) for m in members]
        assert got["reducescatter"] == [float(sum(m + 1 for m in members))] * 2
        assert got["bcast_object"] == {"from": members[-1]}
        assert got["allgather_object"] == members
        assert got["grad"] == [float(k)] * 3
        assert got["set_rank"] == [me, k, me, k]
        assert got["global"] == np_


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np_", [2, 3])
def test_distributed_optimizer_on_a_set(run_ranks, np_):
    reps = _run(run_ranks, np_, "optimizer")
    weights = reps[0]["optimizer"]["weights"]
    assert all(rep["optimizer"]["weights"] == weights for rep in reps)
    evens = list(range(0, np_, 2))
    assert len({weights[r] for r in evens}) == 1  # the even ranks averaged their gradients
    for r in range(1, np_, 2):
        assert weights[r] != weights[0]  # an odd rank stepped on its own gradient


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np_", [2, 3])
def test_errors_fail_the_operation_only(run_ranks, np_):
    reps = _run(run_ranks, np_, "errors")
    for r, rep in enumerate(reps):
        e = rep["errors"]
        if r % 2:
            assert e["not_member"][0] == "ValueError" and f"rank {r} is not in" in e["not_member"][1]
        else:
            assert e["bad_root"][0] == "ValueError" and "root_rank=1" in e["bad_root"][1]
            if np_ == 3:
                assert e["mismatch"][0] == "MismatchError" and "shape" in e["mismatch"][1]
                assert "process set 1" in e["mismatch"][1]
            assert e["after"] == len(range(0, np_, 2))
        assert e["unregistered"][0] == "ValueError" and "not registered" in e["unregistered"][1]
        assert e["disagree"][0] == "ValueError" and "rank 0: [0]" in e["disagree"][1] and "rank 1: [0, 1]" in e["disagree"][1]
        assert e["global_after"] == np_


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np_", [2, 3])
def test_join_rules(run_ranks, np_):
    reps = _run(run_ranks, np_, "join")
    lasts = [rep["join"]["last"] for rep in reps]
    assert all(last == lasts[0] for last in lasts), lasts  # every rank learns the same last rank
    for first, last in enumerate(lasts[0]):
        assert last != first
    if np_ == 2:
        assert lasts[0] == [1, 0]
    for r, rep in enumerate(reps):
        j = rep["join"]
        others = [first for first in range(np_) if first != r]
        for value, first in zip(j["allreduce"], others):
            # joined ranks contribute zeros
            assert value == [float(sum(q + 1 for q in range(np_) if q != first))] * 3
        for kind in ("allgather", "broadcast", "alltoall", "reducescatter"):
            if r == 0:
                assert j["raised"][kind][0] == "joined" and j["raised"][kind][1] != 0
            else:
                assert j["raised"][kind][0] == "MismatchError", (kind, j["raised"][kind])
                assert "joined" in j["raised"][kind][1]
        assert j["after"] == np_
