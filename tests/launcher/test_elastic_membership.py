"""An elastic job's membership as pure logic (``appliance.launcher.elastic.membership``), with time
passed in: hosts oldest first, what a discovery result changed (Horovod's HostUpdateResult), the
blacklist and its cool-down (MIN·2^n plus jitter, capped at MAX; for good without a range), the
reset limit, the slots that should run workers (at most --max-np) and the rank layout of a round."""
from __future__ import annotations

import math

import pytest

from appliance.launcher.elastic.membership import (HostUpdate, Membership, ResetLimitExceeded, cooldown_s,
                                                   layout)


def test_hosts_keep_the_order_they_became_available_in_and_changes_are_named():
    m = Membership(1, 8)
    assert m.update({"a": 2}, 0.0) == HostUpdate.added
    assert m.update({"b": 1, "a": 2}, 1.0) == HostUpdate.added
    assert m.order(1.0) == ["a", "b"]  # b came later: higher ranks, whatever order discovery prints
    assert m.update({"b": 1, "a": 2}, 2.0) == HostUpdate.no_update
    assert m.update({"b": 1, "a": 1}, 3.0) == HostUpdate.removed       # a lost a slot
    assert m.update({"b": 1, "a": 1, "c": 1}, 4.0) == HostUpdate.added
    assert m.update({"b": 2, "c": 1}, 5.0) == HostUpdate.mixed        # a gone, b grew
    assert m.available(5.0) == [("b", 2), ("c", 1)]
    assert m.update({"a": 1, "b": 2, "c": 1}, 6.0) == HostUpdate.added  # a is back: it goes last
    assert m.order(6.0) == ["b", "c", "a"]


def test_target_fills_hosts_oldest_first_up_to_max_np():
    m = Membership(1, 3)
    m.update({"a": 2, "b": 2}, 0.0)
    assert m.target(0.0) == [("a", 0), ("a", 1), ("b", 0)]
    assert m.total_slots(0.0) == 4


def test_blacklist_without_cooldown_is_for_good():
    m = Membership(1, 4)
    m.update({"a": 1, "b": 1}, 0.0)
    assert m.blacklist("b", 10.0) == math.inf
    assert m.order(10.0) == ["a"] and m.is_blacklisted("b", 1e9)
    assert m.update({"a": 1, "b": 1}, 1e9) == HostUpdate.no_update
    assert m.next_cooldown_end(10.0) is None


def test_cooldown_doubles_with_each_failure_plus_jitter_and_is_capped():
    assert cooldown_s(1, (10, 100), 0.0) == 10
    assert cooldown_s(2, (10, 100), 0.0) == 20
    assert cooldown_s(3, (10, 100), 0.5) == 45
    assert cooldown_s(5, (10, 100), 0.9) == 100   # 160 + 9 capped at MAX
    assert cooldown_s(1, (10, 100), 0.99) == pytest.approx(19.9)
    jitter = iter([0.25, 0.0, 0.0])
    m = Membership(1, 4, cooldown_range=(10.0, 100.0), rand=lambda: next(jitter))
    m.update({"a": 1, "b": 1}, 0.0)
    assert m.blacklist("b", 0.0) == 12.5
    assert m.blacklist("b", 5.0) == 12.5           # already out: the cool-down does not restart
    assert m.update({"a": 1, "b": 1}, 12.0) == HostUpdate.no_update  # still cooling down
    assert m.update({"a": 1, "b": 1}, 12.5) == HostUpdate.added      # back, as the newest host
    assert m.order(12.5) == ["a", "b"] and not m.is_blacklisted("b", 12.5)
    assert m.blacklist("b", 20.0) == 40.0          # second failure: 20 s
    assert m.next_cooldown_end(20.0) == 40.0


def test_a_blacklisted_host_comes_back_only_through_discovery():
    m = Membership(1, 4, cooldown_range=(1.0, 1.0), rand=lambda: 0.0)
    m.update({"a": 1, "b": 1}, 0.0)
    m.blacklist("a", 0.0)
    assert m.order(5.0) == ["b"]  # the cool-down ended, but no discovery result since
    m.update({"b": 1}, 5.0)
    assert m.order(5.0) == ["b"]  # not discovered: not available
    m.update({"a": 1, "b": 1}, 6.0)
    assert m.order(6.0) == ["b", "a"]


def test_reset_limit_counts_membership_changes():
    m = Membership(1, 4, reset_limit=2)
    assert m.count_reset() == 1 and m.count_reset() == 2
    with pytest.raises(ResetLimitExceeded, match="--reset-limit 2"):
        m.count_reset()
    with pytest.raises(ResetLimitExceeded, match="--reset-limit 0"):
        Membership(1, 4, reset_limit=0).count_reset()
    unlimited = Membership(1, 4)
    for _ in range(100):
        unlimited.count_reset()


def test_layout_puts_older_hosts_first_with_horovods_local_and_cross_ranks():
    members = [(7, "c", 0), (2, "a", 1), (1, "a", 0), (5, "b", 0), (9, "b", 1), (8, "c", 1)]
    slots = layout(members, ["a", "b", "c"])
    got = {w: (s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size, s.host) for w, s in slots.items()}
    assert got == {1: (0, 0, 2, 0, 3, "a"), 2: (1, 1, 2, 0, 3, "a"), 5: (2, 0, 2, 1, 3, "b"),
                   9: (3, 1, 2, 1, 3, "b"), 7: (4, 0, 2, 2, 3, "c"), 8: (5, 1, 2, 2, 3, "c")}
    assert {s.size for s in slots.values()} == {6}
    uneven = layout([(0, "a", 0), (1, "a", 1), (2, "b", 0)], ["b", "a"])
    assert [(uneven[w].rank, uneven[w].cross_rank, uneven[w].cross_size) for w in (2, 0, 1)] == [
        (0, 0, 2), (1, 1, 2), (2, 0, 1)]
