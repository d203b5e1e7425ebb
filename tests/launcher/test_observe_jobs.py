"""The job's numbers on real jobs: one that grows, and one-rank jobs (the bad-input probe's p26-p28).

Real launcher (``appliance launch`` / ``horovodrun`` as a user runs them), real ranks
(``tests/ranks/observe_elastic.py``: a commit per step, each counted as a step), the view in
lines. Checked: the closing summary counts the steps the script counts, no rank says it cannot
send its metrics, and a one-rank job is scraped like any other. Each job is short and bounded;
its process group is killed whatever happens. The straggler rule at a membership change is
checked on synthetic streams (pure logic), where the timing is the test's own.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from appliance.launcher.observe.state import JobState
from fixtures import RANKS

pytestmark = pytest.mark.timeout(180)
WORKER = RANKS / "observe_elastic.py"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """A launcher command in its own process group, its output in a file the test can poll."""

    def __init__(self, tmp: Path, argv: list[str], env: dict | None = None):
        self.out = tmp / "out.txt"
        self.f = open(self.out, "w")
        self.p = subprocess.Popen(argv, stdout=self.f, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True,
                                  env={**os.environ, "APPLIANCE_VIEW": "lines", "APPLIANCE_VIEW_INTERVAL": "1",
                                       "APPLIANCE_RECORD_DIR": "off", **(env or {})})

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, pattern: str, limit: float) -> re.Match:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            m = re.search(pattern, self.text())
            if m:
                return m
            if self.p.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} within {limit} s:\n{self.text()[-3000:]}")

    def finish(self, limit: float) -> str:
        try:
            self.p.wait(limit)
        finally:
            self.close()
        return self.text()

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait(10)
        self.f.close()


def quiet_metrics(text: str) -> None:
    assert "metrics: cannot send" not in text and "Broken pipe" not in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def test_p27_a_one_rank_job_is_observed(tmp_path):
    """``appliance launch -np 1``: the rank proves the job secret like any other, so the job has a
    view, Prometheus numbers and a summary, and no rank warns about its metrics."""
    port = free_port()
    run = Run(tmp_path, [str(BIN / "appliance"), "launch", "-np", "1", "-H", "localhost:1", "--metrics-port", str(port),
                         "--", sys.executable, str(WORKER), "40", "0.1"])
    try:
        run.wait_for(r"step 10 size 1", 60)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        m = re.search(r"^appliance_job_step\{[^}]*\} (\S+)", body, re.M)
        assert m and float(m.group(1)) >= 1, body
        text = run.finish(60)
    finally:
        run.close()
    assert run.p.returncode == 0, text[-3000:]
    assert re.search(r"appliance launch: job \S+ · 1/1 ranks", text), text[-3000:]
    assert "appliance launch: summary: 40 steps in" in text, text[-3000:]
    quiet_metrics(text)


def test_p28_an_elastic_job_at_one_rank_is_observed(tmp_path):
    """``horovodrun -np 1 --min-np 1 --max-np 2`` whose discovery stays at one slot."""
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:1\n")
    script.chmod(0o755)
    run = Run(tmp_path, [str(BIN / "horovodrun"), "-np", "1", "--min-np", "1", "--max-np", "2",
                         "--host-discovery-script", str(script), sys.executable, str(WORKER), "40", "0.1"],
              env={"APPLIANCE_DISCOVERY_INTERVAL": "0.5"})
    try:
        text = run.finish(90)
    finally:
        run.close()
    assert run.p.returncode == 0, text[-3000:]
    assert "summary: 40 steps in" in text, text[-3000:]
    quiet_metrics(text)


def test_p26_a_job_that_grew_counts_the_steps_the_script_counts(tmp_path):
    """An elastic job grown from 2 ranks to 3: the rank that joins counts from its own start, yet
    the job's step (view and summary) is the script's; no rank says it cannot send."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    run = Run(tmp_path, [str(BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "3",
                         "--host-discovery-script", str(script), sys.executable, str(WORKER), "80", "0.1"],
              env={"APPLIANCE_DISCOVERY_INTERVAL": "0.5"})
    try:
        run.wait_for(r"step 15 size 2", 90)
        hosts.write_text("localhost:3\n")
        run.wait_for(r"step \d+ size 3", 60)
        text = run.finish(90)
    finally:
        run.close()
    assert run.p.returncode == 0, text[-3000:]
    assert re.search(r"round \d+: 3 ranks", text), text[-3000:]
    assert "summary: 80 steps in" in text, text[-3000:]
    quiet_metrics(text)


# -- the straggler rule at a membership change (synthetic streams) -------------------------------------
class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def sample(rank: int, t: float, rnd: int, c: dict) -> dict:
    return {"v": 1, "kind": "sample", "t": t, "rank": rank, "round": rnd, "step": c["step"], "busy_s": c["wait"],
            "wall_s": c["wall"], "wait_s": c["wait"], "late_s": c["late"], "ops": {}}


def test_a_rank_that_joins_is_not_named_straggler_for_its_start():
    """Two ranks train at 10 steps/s; a third joins (a new process in round 2). While it starts,
    the other two wait for it in the state's sync (their wait, its lateness, 3 s of it), then all
    three train evenly: nobody is named straggler, and the job's step goes on from where it was."""
    clock = Clock()
    state = JobState("j1", 2, clock=clock)
    said: list[str] = []
    state.on_event = lambda ev: said.append(ev.text)
    c = {r: {"step": 0, "wall": 0.0, "wait": 0.0, "late": 0.0} for r in range(3)}
    for r in range(2):
        state.message({"kind": "hello", "rank": r, "size": 2, "host": "node0", "pid": 100 + r, "round": 1})

    def second(ranks, rnd, joining=False):
        clock.t += 1.0
        for r in ranks:
            c[r]["wall"] += 1.0
            if joining:  # the sync: the old ranks wait for the new one; it does no step
                if r == 2:
                    c[r]["late"] += 1.0
                else:
                    c[r]["wait"] += 1.0
            else:
                c[r]["step"] += 10
                c[r]["wait"] += 0.01
                c[r]["late"] += 0.01
            state.message(sample(r, clock.t, rnd, c[r]))
        state.snapshot()

    for _ in range(6):
        second([0, 1], 1)
    assert state.snapshot().step == 60
    state.message({"kind": "hello", "rank": 2, "size": 3, "host": "node1", "pid": 200, "round": 2})
    for _ in range(3):
        second([0, 1, 2], 2, joining=True)
    for _ in range(8):
        second([0, 1, 2], 2)
    assert not [s for s in said if s.startswith("straggler")], said
    snap = state.snapshot()
    assert snap.step == 60 + 80 and [r.step for r in snap.ranks] == [140, 140, 140]


# -- a collector that closes a working connection (a membership change) --------------------------------
def test_a_connection_closed_after_it_worked_is_reopened_without_a_word(capfd):
    """The rank's publisher loses a connection that carried its samples (the launcher closed it):
    it opens a new one at once and goes on, and says nothing; a connection refused from the start
    (a collector that closes each one after the hello) is still one warning."""
    import threading

    from appliance.runtime import metrics

    def serve(srv: socket.socket, keep_lines: int, conns: list) -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            f = c.makefile("rb")
            got = [f.readline() for _ in range(keep_lines)]
            conns.append(got)
            f.close()
            c.close()

    for keep, warned in ((4, False), (1, True)):
        metrics._warned.clear()
        srv = socket.create_server(("127.0.0.1", 0))
        conns: list = []
        threading.Thread(target=serve, args=(srv, keep, conns), daemon=True).start()
        hello = {"kind": "hello", "rank": 0}
        pub = metrics.Publisher(srv.getsockname(), 0.05, hello, lambda: {"kind": "sample", "step": 1}).start()
        end = time.monotonic() + 10
        while len(conns) < 3 and time.monotonic() < end:
            time.sleep(0.05)
        pub.stop({"kind": "bye"})
        srv.close()
        assert len(conns) >= 3, conns
        err = capfd.readouterr().err
        assert ("cannot send" in err) is warned, err
        if not warned:  # every connection began with the hello
            assert all(b'"hello"' in c[0] for c in conns), conns
