"""The elastic driver's state machine (``appliance.launcher.elastic.machine``) driven by hand: events
in with a fake clock (``fixtures.elastic_machine.Job``), actions and phases asserted, no process,
socket or thread (as the C++ negotiators are tested); its Kubernetes rules are in
test_elastic_states_k8s.py. Each test pins one transition of the table in the machine's docstring,
or one of Horovod's elastic rules (its ``test/integration/elastic_common.py`` and
``test/single/test_elastic_driver.py``): notice at discovery time, --max-np unset means every
listed slot, every rank failing ends the job at once with Horovod's message, the reset limit as
Horovod counts it, and the bad-input cases (a new worker failing before it joins, an empty
discovery output, huge slot counts)."""
from __future__ import annotations

import math

import pytest

from appliance.common.ranks import Slot
from appliance.launcher.elastic.events import (Answer, CloseHosts, Discovered, DiscoveryFailed, End, Exited,
                                               HostOpened, Joined, Kill, Leaving, Notify, OpenHosts, Release, Remove,
                                               Spawn, SpawnFailed, Tick, Watching)
from appliance.launcher.elastic.failures import HOROVOD_FAILED, LOST_GRACE_S
from appliance.launcher.elastic.machine import TRANSITIONS
from appliance.launcher.elastic.membership import MAX_HOST_SLOTS, Membership
from appliance.launcher.elastic.records import Phase
from fixtures.elastic_machine import Job

pytestmark = pytest.mark.timeout(60)


# -- forming and releasing -----------------------------------------------------------------------
def test_the_first_round_forms_once_the_hosts_are_checked_and_is_released_when_every_member_joined():
    job = Job(np=2, max_np=2)
    assert job.feed(Tick()) == [] and job.phase is Phase.WAITING   # nothing before discovery
    job.feed(Discovered({"a": 1, "b": 1}))
    assert job.of(OpenHosts)[0].hosts == ("a", "b") and job.of(Spawn) == []
    job.feed(HostOpened("a", None))
    assert job.of(Spawn) == [] and job.phase is Phase.WAITING   # b is still being checked
    job.feed(HostOpened("b", None))
    spawns = job.of(Spawn)
    assert [(s.host, s.slot.rank, s.slot.size) for s in spawns] == [("a", 0, 2), ("b", 1, 2)]
    assert job.phase is Phase.FORMING
    assert job.of(Release, job.feed(Joined(0, {"addr": "x", "port": 5}))) == []
    release = job.of(Release, job.feed(Joined(1, {"addr": "y", "port": 6})))[0]
    assert [m.wid for m in release.members] == [0, 1] and release.sync and job.phase is Phase.RUNNING


def test_the_job_waits_for_np_slots_then_fails_after_the_elastic_timeout():
    job = Job(np=2, min_np=1, timeout_s=5)
    job.feed(Discovered({"a": 1}))
    job.feed(HostOpened("a", None))
    assert job.of(Spawn) == [] and "waiting for 2 slots (1 available" in job.said()
    job.feed(Tick(), dt=4)
    assert job.m.outcome is None
    job.feed(Tick(), dt=2)
    assert job.phase is Phase.ENDED and "fewer than -np 2 slots" in job.m.outcome.reason


def test_a_host_failing_its_check_is_blacklisted_and_the_job_goes_on_without_it():
    job = Job(np=1, min_np=1, max_np=4)
    job.feed(Discovered({"a": 1, "b": 1}))
    job.feed(HostOpened("b", "b: ssh: connection refused"))
    job.feed(HostOpened("a", None))
    assert [s.host for s in job.of(Spawn)] == ["a"] and "host b cannot run ranks, blacklisted for good" in job.said()


def test_max_np_unset_runs_every_listed_slot():
    """horovodrun -np 2 --min-np 2 -H a:2,b:2: 4 ranks, as Horovod's fault-tolerance test expects."""
    job = Job(np=2, min_np=2, max_np=None)
    members = job.start({"a": 2, "b": 2})
    assert len(members) == 4
    assert [job.m.round.slots[w].host for w in members] == ["a", "a", "b", "b"]


def test_max_np_caps_the_target_and_a_billion_slots_build_no_billion_entries():
    m = Membership(1, None)
    m.update({"a": 10 ** 9, "b": 3}, 0.0)
    assert m.clamped == ["a"] and len(m.target(0.0)) == MAX_HOST_SLOTS + 3
    m = Membership(1, 10 ** 9)
    m.update({"a": 2, "b": 2}, 0.0)
    assert m.target(0.0) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    job = Job(np=2, min_np=1, max_np=10 ** 9)
    job.feed(Discovered({"localhost": 10 ** 9}))
    job.feed(Discovered({"localhost": 10 ** 9}), dt=1)
    assert job.said().count(f"lists 1000000000 slots; an elastic job uses at most {MAX_HOST_SLOTS}") == 1


# -- host changes: Horovod notifies at discovery time --------------------------------------------
def test_a_new_host_is_announced_to_every_member_at_discovery_before_it_is_checked_or_started():
    job = Job(np=2, min_np=2, max_np=4)
    members = job.start({"a": 2})
    out = job.feed(Discovered({"a": 2, "b": 2}))
    notes = job.of(Notify, out)
    assert len(notes) == 1 and notes[0].wids == tuple(members) and notes[0].result == 2  # HostUpdate.added
    assert job.of(OpenHosts, out)[0].hosts == ("b",) and job.of(Spawn, out) == []     # not checked yet
    assert job.feed(Discovered({"a": 2, "b": 2})) == []                                # told once
    out = job.feed(HostOpened("b", None))
    assert [(s.host, s.index) for s in job.of(Spawn, out)] == [("b", 0), ("b", 1)]     # then started
    assert job.phase is Phase.RUNNING                                                  # training goes on


def test_members_reaching_their_commit_reform_with_the_new_workers_and_that_counts_one_reset():
    job = Job(np=2, min_np=2, max_np=4)
    members = job.start({"a": 2})
    job.feed(Discovered({"a": 2, "b": 2}))
    job.commit_interrupt(members)                       # before b is even checked
    assert job.phase is Phase.BREAKING and job.of(Spawn)[-1].host == "a"
    job.feed(Tick(), dt=0.5)
    assert job.phase is Phase.BREAKING                  # waits for b's check, not a round without it
    job.feed(HostOpened("b", None))
    assert job.phase is Phase.FORMING and len(job.m.round.members) == 4 and job.m.membership.resets == 1
    for wid in job.m.round.members[2:]:
        job.feed(Joined(wid, {"reason": "start"}))
    release = job.of(Release)[-1]
    assert len(release.members) == 4 and release.sync and job.phase is Phase.RUNNING


def test_a_removed_host_is_announced_and_its_workers_leave_at_the_commit_without_a_sync():
    job = Job(np=2, min_np=1, max_np=4)
    members = job.start({"a": 1, "b": 1})
    out = job.feed(Discovered({"b": 1}))
    assert job.of(Notify, out)[0].result == 1           # HostUpdate.removed
    job.commit_interrupt(members)
    removed = job.of(Remove)
    assert [(r.wid, r.ask) for r in removed] == [(0, True)]
    release = job.of(Release)[-1]
    assert [m.wid for m in release.members] == [1] and not release.sync


def test_a_host_that_left_discovery_is_closed_once_its_last_worker_exited_and_opened_again_when_listed():
    job = Job(np=2, min_np=1, max_np=4)
    members = job.start({"a": 1, "b": 1})
    job.feed(Discovered({"b": 1}))
    job.commit_interrupt(members)
    assert job.of(Remove)[-1].wid == 0 and job.of(CloseHosts) == []  # its worker is still leaving
    out = job.feed(Exited(0, 0))
    assert job.of(CloseHosts, out) == [CloseHosts(("a",))]
    assert job.of(CloseHosts, job.feed(Tick(), dt=1)) == []          # once
    out = job.feed(Discovered({"b": 1, "a": 1}))
    assert job.of(OpenHosts, out) == [OpenHosts(("a",))] and job.of(Spawn, out) == []  # checked first
    out = job.feed(HostOpened("a", None))
    assert [s.host for s in job.of(Spawn, out)] == ["a"] and job.of(CloseHosts) == [CloseHosts(("a",))]


def test_a_host_blacklisted_for_good_is_closed_and_one_in_its_cooldown_is_kept():
    job = Job(np=3, min_np=1, max_np=3)
    job.start({"a": 1, "b": 1, "c": 1})
    out = job.feed(Exited(1, 1))
    assert "host b is blacklisted for good" in job.said() and job.of(CloseHosts, out) == [CloseHosts(("b",))]
    job = Job(np=2, min_np=1, max_np=2, cooldown_range=(1.0, 4.0))
    job.start({"a": 1, "b": 1})
    job.feed(Exited(1, 1))
    job.feed(Tick(), dt=5)
    assert "host b is blacklisted for 1 s" in job.said() and job.of(CloseHosts) == []


def test_a_host_still_running_a_leaving_worker_is_not_closed():
    job = Job(np=2, min_np=1, max_np=2)
    job.start({"a": 1, "b": 1})
    job.feed(Discovered({"a": 1}))
    job.feed(Joined(0, {"reason": "hosts"}))
    job.feed(Tick(), dt=10)                                           # b's worker never comes back
    assert job.of(CloseHosts) == [] and job.m.workers[1].alive
    assert job.of(CloseHosts, job.feed(Exited(1, -9))) == [CloseHosts(("b",))]


def test_a_member_watching_late_gets_the_rounds_notice():
    job = Job(np=1, min_np=1, max_np=2)
    job.start({"a": 1})
    job.feed(Discovered({"a": 1, "b": 1}))
    first = job.of(Notify)[-1]
    again = job.of(Notify, job.feed(Watching(0)))
    assert again == [Notify((0,), first.result, first.round_id, first.seq)]


# -- failures --------------------------------------------------------------------------------------
def test_one_rank_failing_blacklists_its_host_and_the_survivors_form_the_next_round():
    job = Job(np=3, min_np=2, max_np=3)
    members = job.start({"a": 1, "b": 1, "c": 1})
    job.feed(Exited(1, 1))
    assert "host b is blacklisted for good" in job.said() and job.phase is Phase.BREAKING
    job.commit_interrupt([0, 2], reason="error")
    release = job.of(Release)[-1]
    assert [m.wid for m in release.members] == [0, 2] and release.sync and job.m.membership.resets == 1
    assert members == [0, 1, 2]


def test_every_rank_failing_ends_the_job_at_once_naming_every_rank():
    """2 hosts x 2 ranks, all raising at one step: each failure blacklists a host and stops its
    other rank; once no member can hold the state the job ends, with Horovod's phrase."""
    job = Job(np=4, min_np=1, max_np=4)
    job.start({"a": 2, "b": 2})
    for wid in (0, 1, 2, 3):
        job.feed(Exited(wid, 1))
    end = job.m.outcome
    assert end is not None and end.code == 1 and job.phase is Phase.ENDED
    assert HOROVOD_FAILED in end.reason and "every rank failed" in end.reason
    for rank in range(4):
        assert f"rank {rank}, host" in end.reason
    assert end.reason.count("exited with code 1") == 4


def test_every_host_failing_ends_the_job_at_once_even_with_ranks_still_stopping():
    """Horovod's test_all_hosts_blacklisted: ranks 0 and 2 fail, one on each host."""
    job = Job(np=4, min_np=1, max_np=4)
    job.start({"a": 2, "b": 2})
    job.feed(Exited(0, 1))
    assert job.m.outcome is None
    job.feed(Exited(2, 3))
    assert job.phase is Phase.FAILING and job.m.outcome is None   # ranks 1 and 3 are being stopped
    job.feed(Exited(1, -15))
    job.feed(Tick(), dt=job.m.config.stop_grace_s + 0.1)                 # rank 3 does not exit in time
    end = job.m.outcome
    assert end is not None and HOROVOD_FAILED in end.reason and "every host failed" in end.reason
    assert end.code == 1 and end.rank == 0
    assert "rank 1, host a) was killed by signal 15" in end.reason
    assert "rank 3, host b) was stopped (its host was blacklisted)" in end.reason


def test_a_new_worker_failing_before_it_joins_leaves_the_members_running_and_is_not_respawned():
    """D1: one host runs every member; the worker started for its new slot fails at start."""
    job = Job(np=2, min_np=1, max_np=4, timeout_s=15)
    members = job.start({"localhost": 2})
    job.feed(Discovered({"localhost": 3}))
    new = job.of(Spawn)[-1].wid
    out = job.feed(Exited(new, 1))
    assert job.of(Remove, out) == [] and job.phase is Phase.RUNNING
    assert "before it joined a round; no new worker starts on host localhost for good" in job.said(out)
    job.commit_interrupt(members)                   # the notice was out: they re-form, on their own
    assert [m.wid for m in job.of(Release)[-1].members] == members
    spawned = len(job.of(Spawn))
    for _ in range(50):
        job.feed(Tick(), dt=1)
    assert len(job.of(Spawn)) == spawned and job.m.outcome is None and job.phase is Phase.RUNNING


def test_with_a_cooldown_a_failing_new_worker_is_retried_with_growing_pauses_and_said_each_time():
    job = Job(np=1, min_np=1, max_np=2, cooldown_range=(1.0, 8.0))
    job.start({"a": 1})
    job.feed(Discovered({"a": 2}))
    times = []
    for _ in range(4):
        wid = job.of(Spawn)[-1].wid
        times.append(job.now)
        job.feed(Exited(wid, 1))
        while job.of(Spawn)[-1].wid == wid:
            job.feed(Tick(), dt=0.25)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]
    assert job.said().count("before it joined a round") == 4


def test_a_member_that_does_not_join_a_new_round_in_time_is_dropped():
    job = Job(np=2, min_np=2, max_np=2, timeout_s=5)
    job.start({"a": 1, "b": 1})
    job.feed(Exited(1, 1))
    job.feed(Joined(0, {"reason": "error"}))
    assert job.phase is Phase.BREAKING                  # 1 slot left: waits for --min-np 2
    job.feed(Discovered({"a": 1, "b": 1, "c": 1}))
    job.feed(HostOpened("c", None))
    assert job.phase is Phase.FORMING
    job.feed(Tick(), dt=2)
    assert "round 2 waits for worker 2 (host c) to join (at most 5 s, --elastic-timeout)" not in job.said()
    job.feed(Tick(), dt=1)
    assert job.said().count("round 2 waits for worker 2 (host c) to join (at most 5 s, --elastic-timeout)") == 1
    job.feed(Tick(), dt=3)
    assert "did not join round 2 within 5 s" in job.said()


def test_a_silent_member_of_a_broken_round_is_taken_as_failed():
    job = Job(np=3, min_np=1, max_np=3)
    job.start({"a": 1, "b": 1, "c": 1})
    job.feed(Exited(2, 1))
    job.feed(Joined(0, {"reason": "error"}))
    assert job.phase is Phase.BREAKING
    job.feed(Tick(silent=frozenset({1})))
    assert "worker 1 (rank 1, host b) stopped answering" in job.said()
    assert [m.wid for m in job.of(Release)[-1].members] == [0]


def test_a_member_named_lost_by_a_member_back_from_the_round_is_killed_and_the_rest_go_on_at_once():
    """A frozen host (its ranks SIGSTOPped, its sshd alive): the survivors' runtimes fail at the
    heartbeat timeout naming the silent rank; the driver does not wait for it to come back."""
    job = Job(np=3, min_np=2, max_np=3)
    job.start({"a": 1, "b": 1, "c": 1})
    job.feed(Joined(0, {"reason": "error", "last": 1, "lost": [2]}), dt=1)
    assert job.phase is Phase.BREAKING and "host c is blacklisted for good" in job.said()  # worker 1 runs on
    assert "worker 2 (rank 2, host c) showed no sign of life to worker 0 (rank 0, host a)" in job.said()
    assert [(r.wid, r.ask) for r in job.of(Remove)] == [(2, False)] and job.of(Kill) == [Kill(2)]
    job.feed(Joined(1, {"reason": "error", "last": 1, "lost": [2]}))
    release = job.of(Release)[-1]
    assert [m.wid for m in release.members] == [0, 1] and release.sync
    job.feed(Tick(), dt=10)
    assert job.of(Kill) == [Kill(2)]                                  # killed once


def test_a_lost_rank_named_for_an_older_round_or_in_a_bad_form_is_not_taken():
    job = Job(np=3, min_np=2, max_np=3, timeout_s=30)
    job.start({"a": 1, "b": 1, "c": 1})
    job.feed(Joined(0, {"reason": "error", "last": 0, "lost": [2]}))
    job.feed(Joined(1, {"reason": "error", "last": 1, "lost": "2"}))
    job.feed(Tick(), dt=5)
    assert job.phase is Phase.BREAKING and job.of(Kill) == [] and job.of(Remove) == []


def test_the_other_ranks_of_a_host_named_lost_leave_with_it():
    job = Job(np=4, min_np=2, max_np=4)
    job.start({"a": 2, "b": 2})
    job.feed(Joined(0, {"reason": "error", "last": 1, "lost": [2]}))
    job.feed(Joined(1, {"reason": "error", "last": 1, "lost": [2]}))
    assert {r.wid for r in job.of(Remove)} == {2, 3} and Kill(2) in job.of(Kill)
    assert [m.wid for m in job.of(Release)[-1].members] == [0, 1]
    job.feed(Tick(), dt=4)
    assert Kill(3) in job.of(Kill)          # TERM waits on a stopped process: KILL after the grace


def test_after_a_member_is_named_lost_the_others_not_back_within_the_grace_are_dropped_too():
    """Two frozen hosts: the survivors' runtimes name one silent rank (the oldest silence); the
    other frozen member is dropped LOST_GRACE_S later, not after --elastic-timeout."""
    job = Job(np=3, min_np=1, max_np=3, timeout_s=600)
    job.start({"a": 1, "b": 1, "c": 1})
    job.feed(Joined(0, {"reason": "error", "last": 1, "lost": [2]}))
    job.feed(Tick(), dt=LOST_GRACE_S)
    assert job.phase is Phase.BREAKING and not job.m.workers[1].leaving
    job.feed(Tick(), dt=0.5)
    assert "worker 1 (rank 1, host b) did not come back within 10 s after a member of round 1" in job.said()
    job.feed(Tick(), dt=0.02)
    assert [m.wid for m in job.of(Release)[-1].members] == [0]


def test_a_start_that_fails_outright_counts_as_that_workers_failure():
    job = Job(np=2, min_np=1, max_np=2)
    job.feed(Discovered({"a": 1, "b": 1}))
    job.feed(HostOpened("a", None))
    job.feed(HostOpened("b", None))
    job.feed(SpawnFailed(1, 255, "ssh: exited with code 255"))
    assert "could not start" in job.said() and "host b is blacklisted" in job.said()


# -- the reset limit, counted as Horovod counts it -------------------------------------------------
@pytest.mark.parametrize("limit, ends", [(1, True), (2, False)])
def test_the_reset_limit_with_hosts_changing_twice(limit, ends):
    job = Job(np=2, min_np=2, max_np=4, reset_limit=limit)
    members = job.start({"localhost": 2})
    job.feed(Discovered({"localhost": 2, "127.0.0.1": 2}))
    job.feed(HostOpened("127.0.0.1", None))
    job.commit_interrupt(members)
    for wid in job.m.round.members[2:]:
        job.feed(Joined(wid, {"reason": "start"}))
    assert job.phase is Phase.RUNNING and job.m.membership.resets == 1
    job.feed(Discovered({"127.0.0.1": 2}))
    job.commit_interrupt(job.m.round.members)
    if ends:
        assert job.m.outcome is not None and job.m.outcome.code == 1
        assert ("Horovod was shutdown because number of resets during elastic job exceeded limit: 1"
                in job.m.outcome.reason) and "--reset-limit 1" in job.m.outcome.reason
    else:
        assert job.m.outcome is None and job.m.membership.resets == 2


# -- discovery ------------------------------------------------------------------------------------
def test_an_empty_discovery_output_keeps_the_workers_until_the_elastic_timeout():
    """D6: a script printing nothing for a while: nobody is told or removed, training goes on."""
    job = Job(np=2, min_np=1, max_np=4, timeout_s=10)
    job.start({"a": 2})
    out = job.feed(Discovered({}), dt=1)
    assert job.of(Notify, out) == [] and job.of(Remove, out) == [] and job.phase is Phase.RUNNING
    assert "the ranks keep training meanwhile" in job.said(out)
    job.feed(Discovered({}), dt=3)
    out = job.feed(Discovered({"a": 2}), dt=3)
    assert job.of(Notify, out) == [] and job.m.outcome is None and job.m.short_since is None
    job.feed(Discovered({}), dt=1)
    job.feed(Tick(), dt=9)
    assert job.m.outcome is None
    job.feed(Tick(), dt=2)
    assert job.m.outcome is not None and "fewer than --min-np 1 slots were available for 10 s" in job.m.outcome.reason


def test_a_broken_first_discovery_ends_the_job_and_later_failures_are_said_once():
    job = Job()
    job.feed(DiscoveryFailed("host discovery script d.sh exited with code 3", first=True))
    assert job.m.outcome.code == 1 and "exited with code 3" in job.m.outcome.reason
    job = Job(np=1, min_np=1, max_np=1)
    job.start({"a": 1})
    for _ in range(3):
        job.feed(DiscoveryFailed("d.sh exited with code 7"))
    job.feed(Discovered({"a": 1}))
    assert job.said().count("code 7") == 1 and job.said().count("works again") == 1
    assert "d.sh exited with code 7 (retrying every 1 s)" in job.said()


# -- the end --------------------------------------------------------------------------------------
def test_a_worker_exiting_0_finishes_the_job_and_stops_workers_that_never_joined():
    job = Job(np=1, min_np=1, max_np=2)
    job.start({"a": 1})
    job.feed(Discovered({"a": 2}))
    new = job.of(Spawn)[-1].wid
    job.feed(Exited(0, 0))
    assert job.phase is Phase.FINISHING and [r.wid for r in job.of(Remove)] == [new]
    job.feed(Joined(new, {}))
    assert job.of(Answer)[-1].answer == {"error": "the job is ending"}
    job.feed(Exited(new, -15))
    assert job.m.outcome == End(0)


def test_a_worker_that_does_not_leave_is_terminated_then_killed_after_the_grace():
    job = Job(np=1, min_np=1, max_np=2, stop_grace_s=1.0)
    job.start({"a": 1})
    job.feed(Discovered({"a": 1, "b": 1}))
    job.feed(HostOpened("b", None))
    job.commit_interrupt([0])
    job.feed(Joined(1, {}))
    job.feed(Discovered({"b": 1}))
    job.commit_interrupt([0, 1])
    assert [(r.wid, r.ask) for r in job.of(Remove)] == [(0, True)]
    job.feed(Tick(), dt=1.5)
    assert job.of(Kill) == [Kill(0, term=True)]
    job.feed(Tick(), dt=1.5)
    assert job.of(Kill)[-1] == Kill(0) and len(job.of(Kill)) == 2
    job.feed(Tick(), dt=5)
    assert len(job.of(Kill)) == 2


def test_every_event_type_has_a_transition_and_nothing_happens_after_the_end():
    assert set(TRANSITIONS) == {Joined, Watching, Leaving, Exited, SpawnFailed, Discovered, DiscoveryFailed,
                                HostOpened, Tick}
    job = Job(np=1, min_np=1, max_np=1)
    job.start({"a": 1})
    job.feed(Exited(0, 1))
    assert job.phase is Phase.ENDED
    assert job.feed(Discovered({"a": 1, "b": 1})) == [] and job.feed(Tick(), dt=100) == []


def test_layout_slots_are_the_records_the_shell_sends():
    job = Job(np=2, min_np=2, max_np=2)
    job.start({"a": 2})
    release = job.of(Release)[-1]
    assert all(isinstance(m.slot, Slot) for m in release.members)
    assert [m.join["port"] for m in release.members] == [1000, 1001]
    assert math.isinf(job.m.membership.blacklist("a", 0.0))


def test_no_class_of_the_elastic_launcher_is_over_250_lines():
    import ast
    from pathlib import Path

    import appliance.launcher.elastic as pkg

    for path in Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno - node.lineno + 1 <= 250, f"{path.name}: class {node.name}"


def test_a_host_whose_workers_fail_before_the_first_round_completes_is_dropped_and_the_rest_start():
    """Horovod's test_rank_and_size_with_host_failure: host-2's workers fail before the first
    rendezvous completes; the job starts with host-1's 2 ranks (size 2, cross size 1)."""
    job = Job(np=2, min_np=2, max_np=4)
    job.feed(Discovered({"host-1": 2, "host-2": 2}))
    job.feed(HostOpened("host-1", None))
    job.feed(HostOpened("host-2", None))
    assert len(job.of(Spawn)) == 4
    job.feed(Joined(0, {}))
    job.feed(Joined(1, {}))
    job.feed(Exited(2, 1))
    job.feed(Exited(3, 1))
    assert "host host-2 is blacklisted for good" in job.said()
    release = job.of(Release)[-1]
    assert [(m.wid, m.slot.rank, m.slot.size, m.slot.cross_size) for m in release.members] == [(0, 0, 2, 1),
                                                                                              (1, 1, 2, 1)]
    assert job.m.membership.resets == 0 and job.m.outcome is None   # the first release: no reset
