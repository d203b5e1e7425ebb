"""The secondaries' registrations on the shared mount (appliance/mount/registry.py): pure rules
with the time passed in, then the operations on real files."""
from __future__ import annotations

import json
import os

import pytest

from appliance.mount import Layout
from appliance.mount.registry import (Registration, beat, is_live, live, register, registrations,
                                      unregister)
from fixtures.bad_records import BAD_CASES, GOOD, make_bad_entry


def test_a_registration_is_live_until_stale_after_its_last_beat():
    assert is_live(100.0, 104.9, 5.0)
    assert not is_live(100.0, 105.0, 5.0)
    assert is_live(100.0, 99.0, 5.0)  # the share's clock a little ahead of ours


def test_a_registration_checks_its_name_port_and_slots():
    with pytest.raises(ValueError):
        Registration.create("-oProxyCommand=x", 22, 1)
    with pytest.raises(ValueError):
        Registration.create("a/b", 22, 1)
    for bad in ({"ssh_port": 0}, {"ssh_port": "22"}, {"slots": 0}, {"slots": 1.5}):
        with pytest.raises(ValueError):
            Registration.from_json({"name": "node2", "ssh_port": 22, "slots": 1, **bad})
    reg = Registration.create("node2", 12345, 2, container="appliance-node2@abc")
    assert Registration.from_json({**json.loads(json.dumps(reg.__dict__)), "future": 1}) == reg


def test_register_beat_and_unregister_on_real_files(tmp_path):
    layout = Layout(str(tmp_path)).ensure()
    a = Registration.create("node2", 12345, 1)
    b = Registration.create("node3", 12345, 2)
    register(layout, a)
    register(layout, b)
    assert [r.name for r, _ in registrations(layout)] == ["node2", "node3"]  # oldest first
    path = layout.secondary_path("node2")
    os.utime(path, (1000.0, 1000.0))
    assert beat(layout, a) and os.stat(path).st_mtime > 1000.0
    # stale: node3's last beat long ago
    os.utime(layout.secondary_path("node3"), (1000.0, 1000.0))
    assert [r.name for r in live(layout, 5.0)] == ["node2"]
    assert [r.name for r in live(layout, 5.0, now=1001.0)] == ["node2", "node3"]
    # a new registration of the same name replaces the record: the old one's beats stop counting
    a2 = Registration.create("node2", 12345, 1)
    register(layout, a2)
    assert not beat(layout, a)
    assert not unregister(layout, "node2", a.token)
    assert unregister(layout, "node2", a2.token)
    assert not beat(layout, a2)  # gone
    assert not os.path.exists(path)


def test_damaged_and_misnamed_records_are_skipped(tmp_path):
    layout = Layout(str(tmp_path)).ensure()
    register(layout, Registration.create("node2", 12345, 1))
    with open(os.path.join(layout.secondaries, "node3.json"), "w") as f:
        f.write("{not json")
    with open(os.path.join(layout.secondaries, "node4.json"), "w") as f:
        json.dump({"name": "node5", "ssh_port": 22, "slots": 1}, f)  # a record under another name
    with open(os.path.join(layout.secondaries, "node6.json.tmp"), "w") as f:
        f.write("{}")
    assert [r.name for r, _ in registrations(layout)] == ["node2"]


def test_no_secondaries_directory_means_no_registrations(tmp_path):
    assert registrations(Layout(str(tmp_path / "nothing"))) == []


@pytest.mark.timeout(20)
@pytest.mark.parametrize("case", BAD_CASES)
def test_one_bad_entry_is_skipped_once_and_the_others_are_read(tmp_path, case):
    layout = Layout(str(tmp_path)).ensure()
    os.makedirs(layout.secondaries, exist_ok=True)
    register(layout, Registration.create("node2", 12345, 2))
    with open(layout.secondary_path("node1"), "w") as f:
        json.dump(GOOD, f)
    bad = os.path.join(layout.secondaries, "bad.json")
    make_bad_entry(case, bad)
    skipped = []
    found = registrations(layout, on_skip=lambda path, why: skipped.append((path, why)))
    assert [r.name for r, _ in found] == ["node1", "node2"]
    assert len(skipped) == 1 and skipped[0][0] == bad and skipped[0][1], skipped
    assert all(type(r.slots) is int and type(r.ssh_port) is int for r, _ in found)
    assert [r.name for r in live(layout, 3600.0)] == ["node1", "node2"]
