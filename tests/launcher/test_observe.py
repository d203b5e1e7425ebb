"""The launcher's view of a job from synthetic metric streams: rates, hosts, stragglers, rendering.

Pure logic (``observe.state``, ``observe.straggler``, ``observe.view``) fed with the wire's
messages as a job of N ranks would send them; time is the messages' own, no clock is read.
"""
from __future__ import annotations

import random
import re

import pytest

from appliance.launcher.observe.state import JobState, busbw_factor
from appliance.launcher.observe.straggler import RankWindow, find_straggler
from appliance.launcher.observe.view import closing_line, render_text, summary_line


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def hosts_of(n: int, per_host: int) -> dict[int, str]:
    return {r: f"node{r // per_host}" for r in range(n)}


class Job:
    """N ranks sending a sample each second; ``slow[rank] = extra seconds per step``."""

    def __init__(self, n: int, per_host: int, step_s: float = 0.1, slow: dict | None = None, total=None, seed=1):
        self.n, self.step_s, self.slow = n, step_s, dict(slow or {})
        self.clock = Clock()
        self.hosts = hosts_of(n, per_host)
        self.state = JobState("j1", n, hosts=self.hosts, clock=self.clock)
        self.rng = random.Random(seed)
        self.c = {r: dict(step=0.0, samples=0.0, busy_s=0.0, wall_s=0.0, wait_s=0.0, late_s=0.0, bytes=0.0, s=0.0)
                  for r in range(n)}
        self.total = total
        for r in range(n):
            self.state.message({"v": 1, "kind": "hello", "job": "j1", "rank": r, "size": n, "local_rank": r % per_host,
                                "host": self.hosts[r], "round": 0, "pid": 100 + r, "auth": None})

    def advance(self, seconds: int = 1) -> None:
        for _ in range(seconds):
            delay = max(self.slow.values(), default=0.0)
            per_step = self.step_s + delay
            steps = 1.0 / per_step
            self.clock.t += 1.0
            for r, c in self.c.items():
                noise = self.rng.uniform(0, 0.0005)
                c["step"] += steps
                c["samples"] += steps * 32
                c["wall_s"] += 1.0
                mine = self.slow.get(r, 0.0)
                c["late_s"] += steps * (mine if mine else noise)
                c["wait_s"] += steps * ((delay - mine) + noise)
                c["busy_s"] += steps * ((delay - mine) + 0.02)
                c["bytes"] += steps * 4e6
                c["s"] += steps * 0.004
                self.state.message({
                    "v": 1, "kind": "sample", "t": self.clock.t, "rank": r, "round": 0, "step": int(c["step"]),
                    "step_src": "optimizer", "samples": int(c["samples"]), "total_steps": self.total,
                    "busy_s": c["busy_s"], "wall_s": c["wall_s"],
                    "ops": {"allreduce": {"n": int(c["step"]), "bytes": c["bytes"], "s": c["s"]}},
                    "wait_s": c["wait_s"], "late_s": c["late_s"], "rss": 500 << 20, "gpu_util": None,
                    "gpu_mem": None})


def test_rates_from_cumulative_counters():
    job = Job(2, 1, step_s=0.1, total=1000)
    job.advance(6)
    snap = job.state.snapshot()
    assert snap.steps_per_s == pytest.approx(10.0, rel=0.05)
    assert snap.samples_per_s == pytest.approx(2 * 320, rel=0.05)
    assert snap.comm_share == pytest.approx(0.2, abs=0.02)       # 0.02 s busy of each 0.1 s step
    r0 = snap.ranks[0]
    assert r0.rates.busbw["allreduce"] == pytest.approx(4e6 / 0.004 * busbw_factor("allreduce", 2), rel=0.01)
    assert snap.total_steps == 1000 and snap.eta_s == pytest.approx((1000 - snap.step) / snap.steps_per_s, rel=0.01)
    assert [h.host for h in snap.hosts] == ["node0", "node1"]


def test_busbw_factors_are_nccl_tests():
    assert busbw_factor("allreduce", 4) == pytest.approx(1.5)
    assert busbw_factor("allgather", 4) == pytest.approx(0.75)
    assert busbw_factor("reducescatter", 4) == pytest.approx(0.75)
    assert busbw_factor("alltoall", 4) == pytest.approx(0.75)
    assert busbw_factor("broadcast", 4) == 1.0


def test_a_restarted_rank_starts_a_new_window():
    job = Job(2, 1)
    job.advance(5)
    job.state.message({"v": 1, "kind": "hello", "rank": 1, "size": 2, "host": "node1", "pid": 999, "round": 1})
    job.state.message({"v": 1, "kind": "sample", "t": job.clock.t + 1, "rank": 1, "round": 1, "step": 3,
                       "busy_s": 0.1, "wall_s": 1.0, "wait_s": 0, "late_s": 0})
    snap = job.state.snapshot()
    # One sample of the new process: its rate counts from where it began (3 steps in its 1 s), not
    # across the restart (the old process's counters would give a negative difference); its step
    # is the job's: the 50 steps of round 0, then its 3 in round 1.
    assert snap.ranks[1].step == 53 and snap.ranks[1].rates.steps_per_s == pytest.approx(3.0)
    assert snap.ranks[1].rates.comm_share == pytest.approx(0.1)
    assert snap.ranks[1].round == 1


def straggler_after(job: Job, limit_s: int):
    for second in range(1, limit_s + 1):
        job.advance(1)
        snap = job.state.snapshot()
        if snap.straggler is not None:
            return second, snap
    return None, job.state.snapshot()


def test_the_slow_rank_is_named_within_10_s():
    job = Job(32, 8, step_s=0.1, slow={13: 0.04})
    second, snap = straggler_after(job, 10)
    assert second is not None, "no straggler named in 10 s"
    assert snap.straggler.rank == 13 and snap.straggler.host == "node1"
    line = snap.straggler.line()
    # 40 ms of a 140 ms step (the steps on the wire are whole: a little more per counted step)
    assert re.fullmatch(r"straggler: rank 13 on node1 keeps the others waiting 4[01] ms per step \(29% of step time\)",
                        line), line
    assert any(e.text == line for e in snap.events)
    assert [h.host for h in snap.hosts if h.straggler] == ["node1"]


def test_no_false_alarm_on_an_even_job():
    job = Job(32, 8, step_s=0.1)
    second, _ = straggler_after(job, 30)
    assert second is None


def test_below_the_threshold_is_no_straggler():
    # 3 ms per step of a 100 ms step: under 10 ms and under 5% of the step time
    job = Job(8, 4, step_s=0.1, slow={2: 0.003})
    second, _ = straggler_after(job, 15)
    assert second is None


def test_the_straggler_clears_when_it_recovers():
    job = Job(4, 2, step_s=0.1, slow={3: 0.05})
    second, snap = straggler_after(job, 10)
    assert second is not None and snap.straggler.rank == 3
    job.slow = {}
    for _ in range(15):
        job.advance(1)
        snap = job.state.snapshot()
        if snap.straggler is None:
            break
    assert snap.straggler is None
    assert snap.events[-1].text == "straggler cleared: rank 3 on node1 keeps pace again"


def test_two_ranks_equally_late_name_nobody():
    w = [RankWindow(0, "a", 50, 5, 0.0, 2.0), RankWindow(1, "a", 50, 5, 2.0, 1.9), RankWindow(2, "b", 50, 5, 2.0, 0)]
    assert find_straggler(w) is None
    w[1] = RankWindow(1, "a", 50, 5, 2.0, 0.1)
    assert find_straggler(w).rank == 0


def test_view_at_2_ranks():
    job = Job(2, 1, total=500)
    job.advance(6)
    text = render_text(job.state.snapshot(), width=140)
    lines = text.splitlines()
    assert lines[0].startswith("job j1 · 2/2 ranks on 2 hosts · step ") and "/500 · 10.0 steps/s" in lines[0]
    assert "ETA" in lines[0]
    assert lines[1].split()[:5] == ["host", "ranks", "step", "steps/s", "samples/s"]
    assert lines[2].split()[:2] == ["node0", "0"] and lines[3].split()[:2] == ["node1", "1"]
    assert "20%" in lines[2]


def test_view_at_128_ranks_on_16_hosts_folds_ranks_into_hosts():
    job = Job(128, 8, slow={77: 0.05})
    straggler_after(job, 10)
    snap = job.state.snapshot()
    text = render_text(snap, width=120)
    rows = [l for l in text.splitlines() if l.startswith("node")]
    assert len(rows) == 16 and all(len(l) <= 120 for l in text.splitlines())
    assert rows[9].split()[:4] == ["node9", "◀", "straggler", "72-79"]
    assert rows[0].split()[:2] == ["node0", "0-7"]
    assert "straggler: rank 77 on node9" in text
    expanded = render_text(snap, ranks=True, width=120).splitlines()
    assert sum(1 for l in expanded if l.strip().startswith("rank")) == 128
    assert any(l.split()[:4] == ["rank", "◀", "straggler", "77"] for l in expanded)


def test_summary_and_closing_lines():
    job = Job(4, 2, slow={1: 0.05})
    straggler_after(job, 10)
    snap = job.state.snapshot()
    line = summary_line(snap)
    assert line.startswith("job j1 · 4/4 ranks on 2 hosts · step ")
    assert re.search(r" · straggler rank 1 on node0 \((4[89]|5[01]) ms/step\)$", line), line
    end = closing_line(snap)
    late = job.c[1]["late_s"]
    assert re.fullmatch(r"summary: \d+ steps in \d+s, [\d.]+ steps/s, [\d.]+ samples/s, communication \d+% of the "
                        r"time, top straggler rank 1 on node0 \(the others waited [\d.]+ s for it\)", end), end
    assert f"waited {late:.1f} s" in end


def test_a_stall_is_said_once_and_its_end_too():
    job = Job(4, 2)
    job.advance(5)
    for _ in range(70):  # the ranks keep reporting, no step finishes
        job.clock.t += 1.0
        for r, c in job.c.items():
            c["wall_s"] += 1.0
            job.state.message({"v": 1, "kind": "sample", "t": job.clock.t, "rank": r, "round": 0,
                               "step": int(c["step"]), "busy_s": c["busy_s"], "wall_s": c["wall_s"],
                               "wait_s": c["wait_s"], "late_s": c["late_s"]})
        job.state.snapshot()
    stalls = [e.text for e in job.state.snapshot().events if e.text.startswith("stall")]
    assert stalls == [f"stall: no rank has finished a step for 60 s (step {int(job.c[0]['step'])}; 4 of 4 ranks "
                      "still report)"]
    job.advance(2)
    assert job.state.snapshot().events[-1].text.startswith("stall over: steps again (step ")
