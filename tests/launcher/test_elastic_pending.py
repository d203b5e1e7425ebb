"""A listed host that does not answer yet (a pod whose DNS record or sshd is not up) does not hold
its place in the --max-np target: pure logic (``membership.Membership.target``'s ``usable``,
``renew``; ``pending.PendingHosts.to_check``) and the elastic state machine with a fake clock
(``fixtures.elastic_machine.Job``). No process, socket or thread; the real launcher's case is
tests/launcher/test_kubernetes_bad_input.py (k20b, k20c)."""
from __future__ import annotations

import time

import pytest

from appliance.launcher.elastic.events import Discovered, HostOpened, Joined, Notify, OpenHosts, Spawn, Tick
from appliance.launcher.elastic.hosts import target_slots
from appliance.launcher.elastic.membership import Membership
from appliance.launcher.elastic.pending import CHECK_AHEAD, SAY_HOSTS, PendingHosts
from appliance.launcher.elastic.records import Phase
from fixtures.elastic_machine import Job

pytestmark = pytest.mark.timeout(60)


# -- pure logic -------------------------------------------------------------------------------------
def test_a_refused_slot_leaves_its_place_in_max_np_to_the_next_host():
    m = Membership(1, 2)
    m.update({"p": 2, "r": 2, "s": 2}, 0.0)
    assert m.target(0.0) == [("p", 0), ("p", 1)]
    assert m.target(0.0, lambda t: t[0] != "p") == [("r", 0), ("r", 1)]
    assert m.target(0.0, lambda t: t != ("r", 0) and t[0] != "p") == [("r", 1), ("s", 0)]
    assert m.target(0.0, lambda t: False) == []
    unlimited = Membership(1, None)
    unlimited.update({"p": 1, "r": 2}, 0.0)
    assert unlimited.target(0.0, lambda t: t[0] != "p") == [("r", 0), ("r", 1)]


def test_a_host_that_answers_only_now_goes_last():
    m = Membership(1, 2)
    m.update({"p": 1, "r": 1}, 0.0)
    m.renew("p")
    assert m.order(1.0) == ["r", "p"] and m.target(1.0) == [("r", 0), ("p", 0)]
    m.renew("gone")  # a host discovery no longer knows: nothing to do
    assert m.order(1.0) == ["r", "p"]


def test_to_check_walks_past_pending_hosts_in_doubling_batches():
    p = PendingHosts()
    listed = [f"w{i}" for i in range(300)]
    assert p.to_check(listed, ["w0"], set(), False, 0.0) == ["w0"]  # nothing pending: the target only
    p.failed("w0", 0.0)
    assert p.to_check(listed, ["w1"], set(), False, 0.0) == ["w1", "w2"]  # one ahead per pending host
    for h in ("w1", "w2"):
        p.failed(h, 0.0)
    assert p.to_check(listed, ["w3"], set(), False, 0.0) == ["w3", "w4", "w5", "w6"]
    for i in range(3, CHECK_AHEAD + 10):
        p.failed(f"w{i}", 0.0)
    n = CHECK_AHEAD + 10
    batch = p.to_check(listed, [f"w{n}"], {f"w{n + 1}"}, False, 0.0)
    assert batch == [f"w{n}", *[f"w{i}" for i in range(n + 2, n + 2 + CHECK_AHEAD)]]  # at most CHECK_AHEAD ahead
    # pending hosts are checked again only while the target is short, once their pause is over
    assert not any(h in p.hosts for h in p.to_check(listed, [], set(), False, 5.0))
    assert p.to_check(listed, [], set(), True, 0.5)[:1] != ["w0"]  # its pause (1 s) is not over
    again = [h for h in p.to_check(listed, [], set(), True, 5.0) if h in p.hosts]
    assert again == [f"w{i}" for i in range(CHECK_AHEAD)]


def test_many_pending_hosts_are_said_a_few_a_minute_not_one_line_each():
    p = PendingHosts()
    said = [h for h in (f"w{i}" for i in range(1000)) if p.failed(h, 0.0)]
    assert said == [f"w{i}" for i in range(SAY_HOSTS)]
    assert not p.failed("w999", 30.0)                      # the minute is not over
    assert p.failed("w999", 61.0) and p.failed("w0", 61.0)  # then the next ones, each once a minute


# -- the state machine ------------------------------------------------------------------------------
def test_a_pending_host_listed_first_does_not_keep_a_ready_one_out_of_max_np():
    """The probe's k20c: discovery lists a pod that does not resolve, then a ready host; --max-np
    covers one host. The job starts on the ready one at once, not after --elastic-timeout."""
    job = Job(np=2, min_np=1, max_np=2, timeout_s=600.0, kubernetes=True)
    job.feed(Discovered({"worker-0.nosuch.invalid": 2, "localhost": 2}))
    assert job.of(OpenHosts) == [OpenHosts(("worker-0.nosuch.invalid",))]
    job.feed(HostOpened("worker-0.nosuch.invalid", "worker-0.nosuch.invalid does not resolve"))
    assert job.of(OpenHosts)[-1] == OpenHosts(("localhost",))
    job.feed(HostOpened("localhost", None))
    assert [(s.host, s.index) for s in job.of(Spawn)] == [("localhost", 0), ("localhost", 1)]
    assert "waiting for" not in job.said()
    for wid in (0, 1):
        job.feed(Joined(wid, {"reason": "start", "addr": "10.0.0.1", "port": 1000 + wid}))
    assert job.phase is Phase.RUNNING
    # the pod comes up later: it goes last, so the job stays where it runs (no notice, no move)
    job.feed(Tick(), dt=2.0)
    job.feed(HostOpened("worker-0.nosuch.invalid", None))
    job.feed(Tick(), dt=1.0)
    assert "answers now" in job.said() and not job.of(Notify) and len(job.of(Spawn)) == 2
    assert target_slots(job.m, job.now) == [("localhost", 0), ("localhost", 1)]


def test_thousands_of_pending_pods_before_a_ready_host_are_walked_past_in_seconds():
    """The probe's k20b at the machine's level: 3000 listed pods that do not answer, then the
    ready host. Checks go out in batches (each pending host adds one ahead, at most CHECK_AHEAD),
    and the machine decides once per batch, not once per host."""
    hosts = {f"appliance-elastic-worker-{i}.appliance-elastic.default.svc": 2 for i in range(3000)}
    hosts["localhost"] = 2
    job = Job(np=2, min_np=1, max_np=2, timeout_s=600.0, kubernetes=True)
    t0 = time.monotonic()
    job.feed(Discovered(hosts))
    answered: set[str] = set()
    while not job.of(Spawn):
        batch = [h for a in job.of(OpenHosts) for h in a.hosts if h not in answered]
        assert batch, job.said()[-2000:]
        for h in batch:
            answered.add(h)
            job.feed(HostOpened(h, None if h == "localhost" else f"{h} does not resolve"))
    took = time.monotonic() - t0
    assert [s.host for s in job.of(Spawn)] == ["localhost", "localhost"]
    assert len(job.of(OpenHosts)) < 3000 // CHECK_AHEAD + 20  # batches, not one host at a time
    assert took < 20, f"{took:.1f} s"
