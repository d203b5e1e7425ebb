"""A worker's one state (``appliance.launcher.elastic.records``): every move ``MOVES`` lists is
allowed, every other one is an assertion naming both states, and the machine walks a worker
through them as its table says (pure logic, a fake clock: no process, socket or thread)."""
from __future__ import annotations

import itertools

import pytest

from appliance.launcher.elastic.events import Discovered, Exited, Joined, Kill, Remove, Tick
from appliance.launcher.elastic.records import ENDED, LEAVING, MOVES, WorkerRec, WorkerState as S
from fixtures.elastic_machine import Job


def rec(state: S) -> WorkerRec:
    return WorkerRec(7, "hostA", 0, state=state)


@pytest.mark.parametrize("move", sorted(MOVES, key=lambda m: (m[0].value, m[1].value)),
                         ids=lambda m: f"{m[0].name}->{m[1].name}")
def test_every_listed_move_is_made(move):
    w = rec(move[0])
    w.move(move[1], 12.5)
    assert w.state is move[1] and w.since == 12.5


ILLEGAL = [(a, b) for a, b in itertools.product(S, S) if (a, b) not in MOVES]


@pytest.mark.parametrize("move", ILLEGAL, ids=lambda m: f"{m[0].name}->{m[1].name}")
def test_every_other_move_is_an_assertion_naming_both_states(move):
    w = rec(move[0])
    with pytest.raises(AssertionError) as err:
        w.move(move[1], 1.0)
    assert f"from {move[0].name} to {move[1].name}" in str(err.value) and "worker 7" in str(err.value)
    assert w.state is move[0]  # nothing moved


def test_the_table_has_no_dead_end():
    """Every state is reached from STARTING, every live one can end, and nothing leaves LEFT."""
    def reach(start):
        seen, todo = {start}, [start]
        while todo:
            here = todo.pop()
            for a, b in MOVES:
                if a is here and b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen
    assert reach(S.STARTING) == set(S)
    for state in set(S) - ENDED:
        assert reach(state) & ENDED, state
    assert not [m for m in MOVES if m[0] is S.LEFT]
    assert ILLEGAL and len(ILLEGAL) + len(MOVES) == len(S) ** 2


def test_exited_is_left_after_a_removal_and_exited_otherwise():
    for state in LEAVING:
        w = rec(state)
        w.exited(0, 3.0)
        assert w.state is S.LEFT and w.leaving and not w.alive and w.exit_code == 0
    w = rec(S.TRAINING)
    w.exited(1, 3.0)
    assert w.state is S.EXITED and not w.leaving and not w.alive and w.exit_code == 1


def test_the_machine_walks_a_worker_through_its_states():
    """Started, joined, training, back at a commit, removed at its join (asked), TERM then KILL
    after the graces, gone; a member exiting 0 after being asked to leave is LEFT."""
    job = Job(np=2, min_np=1, max_np=2, stop_grace_s=1.0)
    members = job.start({"a": 1, "b": 1})
    w0, w1 = (job.m.workers[wid] for wid in members)
    assert w0.state is S.TRAINING and w1.state is S.TRAINING
    job.feed(Joined(w1.wid, {"reason": "hosts"}))
    assert w1.state is S.JOINED
    job.feed(Discovered({"a": 1}))                      # b leaves the listing: w1 is removed at its join
    job.feed(Joined(w0.wid, {"reason": "hosts"}))
    assert w1.state is S.ASKED and job.of(Remove)[-1] == Remove(w1.wid, job.of(Remove)[-1].why, ask=True)
    job.feed(Tick(), dt=1.5)                            # it did not exit: TERM
    assert w1.state is S.STOPPING and job.of(Kill)[-1] == Kill(w1.wid, term=True)
    job.feed(Tick(), dt=1.5)                            # still there: KILL
    assert w1.state is S.KILLED and job.of(Kill)[-1] == Kill(w1.wid)
    job.feed(Exited(w1.wid, -9))
    assert w1.state is S.LEFT and not w1.alive
    assert w0.state is S.TRAINING                       # the next round went ahead without it
