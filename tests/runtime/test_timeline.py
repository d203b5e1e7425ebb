"""Horovod's timeline on 2 real ranks: the file rank 0 writes (tests/ranks/timeline.py).

Checks effects only: the file is complete JSON (json.load) after stop_timeline() and after a clean
shutdown, has one "process" per tensor name, NEGOTIATE_<KIND> phases with a readiness mark per
rank, the operation phases with their steps, B/E balanced per track, fusion copies only for the
fused batch; an unwritable path is refused by name at start_timeline and only reported for
HOROVOD_TIMELINE (the job runs on).
"""
from __future__ import annotations

import json
from collections import defaultdict

import pytest

P = 2
SMALL = [f"small.{i}" for i in range(5)]


def load(path) -> list:
    with open(path) as f:
        events = json.load(f)  # complete JSON, not just an open array
    assert isinstance(events, list) and events
    return events


def by_tensor(events) -> dict:
    """tensor name -> its events in file order (the file is written in time order)."""
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name" and e["pid"]}
    out = defaultdict(list)
    for e in events:
        if e.get("ph") in ("B", "E", "X"):
            out[names[e["pid"]]].append(e)
    return out


def assert_balanced(evs, name):
    depth = defaultdict(int)
    for e in evs:
        if e["ph"] == "B":
            depth[e["tid"]] += 1
        elif e["ph"] == "E":
            depth[e["tid"]] -= 1
            assert depth[e["tid"]] >= 0, f"{name}: E without B"
    assert all(d == 0 for d in depth.values()), f"{name}: unclosed B {dict(depth)}"


def phases(evs) -> list:
    return [e["name"] for e in evs if e["ph"] == "B"]


def check_ops_file(path):
    events = load(path)
    tensors = by_tensor(events)
    assert set(SMALL + ["large", "gather", "bcast"]) <= set(tensors), sorted(tensors)
    for name, evs in tensors.items():
        assert_balanced(evs, name)
    for name, kind, collective in [*[(s, "ALLREDUCE", "CPU_ALLREDUCE") for s in SMALL],
                                   ("large", "ALLREDUCE", "CPU_ALLREDUCE"), ("gather", "ALLGATHER", "CPU_ALLGATHER"),
                                   ("bcast", "BROADCAST", "CPU_BROADCAST")]:
        evs = tensors[name]
        ph = phases(evs)
        fused = name in SMALL
        want = ["NEGOTIATE_" + kind, kind, "QUEUE"]
        want += ["MEMCPY_IN_FUSION_BUFFER", collective, "MEMCPY_OUT_FUSION_BUFFER"] if fused else [collective]
        assert ph == want, (name, ph)
        marks = sorted(e["name"] for e in evs if e["ph"] == "X")
        assert marks == [str(r) for r in range(P)], (name, marks)  # each rank's readiness, once
        ts = [e["ts"] for e in evs]
        assert ts == sorted(ts), name
    last_e = [e for e in tensors["large"] if e["ph"] == "E"][-1]
    assert last_e["args"] == {"dtype": "float32", "shape": f"[{1 << 20}]"}
    return events, tensors


@pytest.mark.timeout(120)
def test_start_and_stop_at_runtime_write_every_phase_of_each_tensor(run_ranks, tmp_path):
    path = tmp_path / "tl.json"
    ranks = run_ranks(P, "timeline", "runtime", path, timeout=90)
    assert all(ranks[r]["ok"] for r in range(P))
    events, tensors = check_ops_file(path)
    assert "before_start" not in tensors and "after_stop" not in tensors, sorted(tensors)
    assert not any(e.get("name") == "CYCLE_START" for e in events)  # mark_cycles defaults to False
    first = load(f"{path}.first")  # replaced by a start on another path: completed, no operation in it
    assert not any(e.get("ph") == "B" and not e["name"].startswith("NEGOTIATE_") for e in first)


@pytest.mark.timeout(120)
def test_horovod_timeline_at_init_is_complete_after_shutdown_with_cycle_marks(run_ranks, tmp_path):
    path = tmp_path / "env.json"
    run_ranks(P, "timeline", "env", "-", timeout=90,
              env={"HOROVOD_TIMELINE": str(path), "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    events, _ = check_ops_file(path)
    assert any(e.get("ph") == "i" and e.get("name") == "CYCLE_START" for e in events)
    start = [e for e in events if e.get("pid") == 0 and e.get("name") == "process_name"]
    assert start and start[0]["args"]["start_time_since_epoch_in_micros"] > 0


@pytest.mark.timeout(120)
def test_unwritable_path_is_refused_by_name_on_rank_0_and_the_job_runs_on(run_ranks, tmp_path):
    bad = tmp_path / "no-such-dir" / "tl.json"
    ranks = run_ranks(P, "timeline", "unwritable", bad, timeout=90)
    raised = ranks[0]["raised"]
    assert raised and raised.startswith("ValueError: ") and str(bad) in raised, raised
    assert ranks[1]["raised"] is None  # only rank 0 writes a timeline
    assert all(ranks[r]["ok"] for r in range(P)) and not bad.parent.exists()


@pytest.mark.timeout(120)
def test_unwritable_horovod_timeline_is_one_line_on_rank_0_and_the_job_runs_on(run_ranks, tmp_path):
    bad = tmp_path / "no-such-dir" / "tl.json"
    ranks = run_ranks(P, "timeline", "env", "-", timeout=90, env={"HOROVOD_TIMELINE": str(bad)})
    assert all(ranks[r]["ok"] for r in range(P))  # and the launch succeeded (run_ranks checks)
    said = [line for line in ranks.output(0, "stderr").splitlines() if str(bad) in line]
    assert len(said) == 1 and "HOROVOD_TIMELINE" in said[0], ranks.output(0, "stderr")
    assert str(bad) not in ranks.output(1) and not bad.parent.exists()
