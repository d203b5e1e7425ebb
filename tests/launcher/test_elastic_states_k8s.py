"""The elastic driver's state machine (``appliance.launcher.elastic.machine``) under Kubernetes'
rules, driven by hand with a fake clock (``fixtures.elastic_machine.Job``; the other transitions are
tests/launcher/test_elastic_states.py): a listed host that does not answer yet is pending, not
failed, and said at most once a minute; a rank sent SIGTERM (its pod deleted, ``replicas``
lowered) leaves at the next commit with no blacklist, restore or sync (below ``--min-np`` the others
wait for slots up to the elastic timeout, then the job fails naming it); a crash is blacklisted with
the cool-down, so the re-created pod of the same name is checked afresh. No process, socket or thread."""
from __future__ import annotations

import pytest

from appliance.launcher.elastic.events import (Answer, CloseHosts, Discovered, Exited, HostOpened, Joined, Kill, Leaving,
                                               Notify, OpenHosts, Release, Remove, Spawn, Tick)
from appliance.launcher.elastic.records import Phase
from fixtures.elastic_machine import Job

pytestmark = pytest.mark.timeout(60)


def test_kubernetes_a_listed_host_not_answering_is_pending_retried_and_said_once_a_minute():
    job = Job(np=1, min_np=1, max_np=4, kubernetes=True)
    job.feed(Discovered({"a": 1, "b": 1}))
    job.feed(HostOpened("a", None))
    job.feed(HostOpened("b", "b does not resolve (Name or service not known)"))
    assert [s.host for s in job.of(Spawn)] == ["a"] and "blacklist" not in job.said()
    assert job.said().count("host b is listed but does not answer yet; pending") == 1
    assert not job.m.membership.is_blacklisted("b", job.now)
    job.feed(Joined(0, {"reason": "start", "addr": "10.0.0.1", "port": 1000}))
    assert job.phase is Phase.RUNNING  # the job runs on what answers
    opens = len(job.of(OpenHosts))
    job.feed(Tick(), dt=0.5)
    assert len(job.of(OpenHosts)) == opens  # not before its pause (1 s, doubling up to 10 s)
    for _ in range(12):  # a name that never resolves: checked again and again, said once a minute
        job.feed(Tick(), dt=10.0)
        assert job.of(OpenHosts)[-1].hosts == ("b",)
        job.feed(HostOpened("b", "b does not resolve (Name or service not known)"))
    assert len(job.of(OpenHosts)) > opens + 10
    assert job.said().count("host b is listed but does not answer yet") == 3  # at 0, 60.5 and 120.5 s: once a minute
    job.feed(Tick(), dt=10.0)
    job.feed(HostOpened("b", None))
    assert "host b answers now" in job.said() and [s.host for s in job.of(Spawn)] == ["a", "b"]


def test_kubernetes_a_pending_host_that_leaves_discovery_is_forgotten():
    job = Job(np=1, min_np=1, max_np=4, kubernetes=True)
    job.feed(Discovered({"a": 1, "b": 1}))
    job.feed(HostOpened("a", None))
    job.feed(HostOpened("b", "b:2222 refused the connection"))
    job.feed(Discovered({"a": 1}), dt=1.0)
    assert "b" not in job.m.pending.hosts


def test_kubernetes_a_rank_ended_by_sigterm_leaves_without_blacklist_and_the_job_goes_on():
    job = Job(np=3, min_np=1, max_np=3, kubernetes=True, cooldown_range=(10.0, 300.0))
    job.start({"a": 1, "b": 1, "c": 1})
    job.feed(Exited(2, -15))
    assert "ended by SIGTERM: it leaves the job (not a failure)" in job.said() and job.phase is Phase.BREAKING
    assert not job.m.membership.is_blacklisted("c", job.now) and job.m.membership.is_held("c", job.now)
    job.commit_interrupt([0, 1])
    release = job.of(Release)[-1]
    assert [m.wid for m in release.members] == [0, 1] and job.m.outcome is None and job.phase is Phase.RUNNING
    # the same pod name back after the hold: new workers start there again
    job.feed(Discovered({"a": 1, "b": 1, "c": 1}), dt=11.0)
    assert job.of(Spawn)[-1].host == "c"


def test_kubernetes_a_crashed_pod_is_closed_and_the_re_created_pod_of_that_name_checked_afresh():
    job = Job(np=2, min_np=1, max_np=2, kubernetes=True, cooldown_range=(10.0, 300.0))
    job.start({"a": 1, "b": 1})
    out = job.feed(Exited(1, -9))
    assert "host b is blacklisted for 10 s" in job.said() and job.of(CloseHosts, out) == [CloseHosts(("b",))]
    job.commit_interrupt([0], reason="error")
    assert job.phase is Phase.RUNNING and [m.wid for m in job.of(Release)[-1].members] == [0]
    opens = len(job.of(OpenHosts))
    job.feed(Discovered({"a": 1, "b": 1}), dt=11.0)  # the same name, a new pod
    assert job.of(OpenHosts)[opens:] == [OpenHosts(("b",))]
    job.feed(HostOpened("b", None))
    assert job.of(Spawn)[-1].host == "b"


def test_a_member_sent_sigterm_leaves_at_the_next_commit_without_blacklist_restore_or_sync():
    job = Job(np=3, min_np=1, max_np=3, cooldown_range=(10.0, 300.0))
    members = job.start({"a": 1, "b": 1, "c": 1})
    notices = len(job.of(Notify))
    out = job.feed(Leaving(2))
    assert job.of(Answer, out) == [Answer(2, {"leave": True}, leave=True)]
    note = job.of(Notify, out)  # every member told at once, as for a host removed from discovery
    assert len(job.of(Notify)) == notices + 1 and note[0].wids == tuple(members) and note[0].result == 1
    assert not job.of(Remove, out) and not job.of(Kill, out) and job.phase is Phase.RUNNING  # it trains on
    assert "was sent SIGTERM: it leaves the job at its next commit" in job.said()
    assert "hosts changed (removed): available now a:1, b:1, c:1; leaving: c" in job.said()
    assert not job.m.membership.is_blacklisted("c", job.now) and job.m.membership.is_held("c", job.now)
    assert job.of(Answer, job.feed(Leaving(2))) == [Answer(2, {"leave": True}, leave=True)]  # asked twice: once
    assert len(job.of(Notify)) == notices + 1
    job.commit_interrupt(members)  # the commit: every member back with the host-update interrupt
    removed = job.of(Remove)
    assert [(r.wid, r.ask) for r in removed] == [(2, True)] and "SIGTERM" in removed[0].why
    release = job.of(Release)[-1]
    assert [m.wid for m in release.members] == [0, 1] and release.sync is False  # no restore, no sync
    job.feed(Exited(2, 0))  # "removed": it prints its line and exits 0
    assert job.phase is Phase.RUNNING and job.m.outcome is None and "blacklist" not in job.said()
    assert not job.of(Spawn)[3:]  # nothing new on its host during the hold
    job.feed(Tick(), dt=5.0)
    assert not job.of(Kill) and job.m.workers[2].exit_code == 0


def test_a_leave_request_is_refused_for_a_worker_being_stopped_or_unknown_and_after_the_job_ends():
    job = Job(np=2, min_np=1, max_np=2)
    job.start({"a": 1, "b": 1})
    assert job.of(Answer, job.feed(Leaving(7)))[0].answer == {"error": "worker 7 is not part of this job"}
    job.feed(Discovered({"a": 1}))  # b leaves discovery: its worker is removed at the commit
    job.commit_interrupt([0, 1])
    assert job.of(Answer, job.feed(Leaving(1)))[0].answer == {"error": "the launcher is stopping it"}
    job.feed(Exited(1, 0))
    assert job.of(Answer, job.feed(Leaving(1)))[0].answer["error"] == "worker 1 is not part of this job"
    job = Job(np=2, min_np=1, max_np=2)
    job.start({"a": 1, "b": 1})
    job.feed(Exited(0, 0))  # a worker finished: the job is finishing
    assert job.of(Answer, job.feed(Leaving(1)))[0].answer == {"error": "the job is ending"}


def test_a_worker_not_training_in_a_round_that_asks_to_leave_is_removed_at_once():
    job = Job(np=1, min_np=1, max_np=2, cooldown_range=(10.0, 300.0))
    job.start({"a": 1})
    job.feed(Discovered({"a": 1, "b": 1}))
    job.feed(HostOpened("b", None))
    assert job.of(Spawn)[-1].wid == 1
    job.feed(Joined(1, {"reason": "start"}))  # the new worker waits for the next round
    out = job.feed(Leaving(1))
    assert job.of(Answer, out)[0].answer == {"leave": True}
    assert [(r.wid, r.ask) for r in job.of(Remove, out)] == [(1, True)]
    job.commit_interrupt([0])
    assert [m.wid for m in job.of(Release)[-1].members] == [0] and job.phase is Phase.RUNNING


def test_a_departing_worker_ended_by_a_second_sigterm_leaves_without_blacklist_anywhere():
    job = Job(np=2, min_np=1, max_np=2)
    job.start({"a": 1, "b": 1})
    job.feed(Leaving(1))
    job.feed(Exited(1, -15))
    assert "ended by SIGTERM: it leaves the job (not a failure)" in job.said() and "blacklisted" not in job.said()
    assert job.phase is Phase.BREAKING
    job.commit_interrupt([0], reason="error")
    assert [m.wid for m in job.of(Release)[-1].members] == [0] and job.m.outcome is None


def test_sigterm_elsewhere_is_a_failure_and_a_crash_on_kubernetes_uses_the_cooldown():
    job = Job(np=2, min_np=1, max_np=2)
    job.start({"a": 1, "b": 1})
    job.feed(Exited(1, -15))
    assert "host b is blacklisted for good" in job.said()
    job = Job(np=2, min_np=1, max_np=2, kubernetes=True, cooldown_range=(10.0, 300.0))
    job.start({"a": 1, "b": 1})
    job.feed(Exited(1, 1))
    assert "host b is blacklisted for 10 s" in job.said()


@pytest.mark.parametrize("new_pod", [False, True], ids=["none-comes", "one-comes-in-time"])
def test_a_leave_below_min_np_waits_for_slots_then_fails_naming_min_np(new_pod):
    # replicas lowered below --min-np: the leave is taken (the pod goes either way), the survivor
    # waits at its commit for --elastic-timeout; a pod listed in time re-forms the job with it (and
    # the state synced to it), none ends the job with exit 1 naming --min-np.
    job = Job(np=2, min_np=2, max_np=2, timeout_s=5, cooldown_range=(10.0, 300.0))
    members = job.start({"a": 1, "b": 1})
    assert job.of(Answer, job.feed(Leaving(1))) == [Answer(1, {"leave": True}, leave=True)]
    job.commit_interrupt(members)
    job.feed(Exited(1, 0))
    assert "waiting for 2 slots (1 available; at most 5 s)" in job.said() and job.m.outcome is None
    if new_pod:
        job.feed(Discovered({"a": 1, "c": 1}), dt=2)
        spawned = job.of(Spawn, job.feed(HostOpened("c", None)))
        assert [s.host for s in spawned] == ["c"]
        job.feed(Joined(spawned[0].wid, {"reason": "start", "addr": "10.0.0.3", "port": 2000}))
        release = job.of(Release)[-1]
        assert [m.host for m in release.members] == ["a", "c"] and release.sync is True
        job.feed(Tick(), dt=10)
        assert job.phase is Phase.RUNNING and job.m.outcome is None
    else:
        job.feed(Tick(), dt=6)
        assert job.phase is Phase.ENDED and job.m.outcome.code == 1
        assert "fewer than --min-np 2 slots were available for 5 s (--elastic-timeout)" in job.m.outcome.reason
    assert "blacklist" not in job.said()
