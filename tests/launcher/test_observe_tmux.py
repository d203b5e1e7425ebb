"""The launcher's view of a real job as a person sees it: a terminal (tmux), off a terminal, and off.

Real ranks (``tests/ranks/observe_worker.py``: 2 local ranks, steps of 40 ms, rank 1 30 ms
slower in the first test) send their metrics to a real ``appliance launch``. In tmux: the live
table appears with the job's header, names the straggler (the right rank, within 10 s of the
first numbers), key ``r`` unfolds the host into its ranks, every line of the job's output is in
the scrollback whole and in order, the closing summary is printed and the terminal is left in
canonical mode. Off a terminal: summary lines every APPLIANCE_VIEW_INTERVAL and no straggler on
an even job; ``--no-view``: none of them, the record still written.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time

import pytest

from fixtures.tmux import Terminal

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "ranks", "observe_worker.py")
LINE = re.compile(r"^\[(\d+)\]<stdout>:rank (\d+) step (\d+) line (\d+)$")

pytestmark = pytest.mark.timeout(150)


def launch_argv(*flags: str, steps: int, slow: tuple = (-1, 0), every: int = 10) -> list[str]:
    return [sys.executable, "-m", "appliance", "launch", "-np", "2", "--launcher", "local", *flags, "--",
            sys.executable, WORKER, str(steps), "40", str(slow[0]), str(slow[1]), str(every)]


def check_output_lines(text: str, ranks: int, lines: int) -> None:
    """Every rank's lines 1..lines, each exactly once, whole, in order; no garbled output line."""
    seen: dict = {r: [] for r in range(ranks)}
    for raw in text.splitlines():
        if "<stdout>:" not in raw:
            continue
        m = LINE.match(raw.rstrip())
        assert m, f"a garbled output line: {raw!r}"
        prefix, rank, step, n = map(int, m.groups())
        assert prefix == rank and step == n * 10
        seen[rank].append(n)
    for r, got in seen.items():
        assert got == list(range(1, lines + 1)), f"rank {r}'s lines: {got}"


def test_live_view_in_a_terminal(tmp_path, require_tool):
    require_tool("tmux", "a real terminal for the view")
    rec = tmp_path / "rec"
    env = {"APPLIANCE_RECORD_DIR": str(rec), "APPLIANCE_METRICS_INTERVAL": "0.5"}
    with Terminal(160, 50, env=env, cwd=str(tmp_path)) as term:
        term.type(shlex.join(launch_argv(steps=200, slow=(1, 30))) + "; echo EXIT=$?")
        header = re.compile(r"job \w+ · 2/2 ranks on 1 host · step \d+/200 · [\d.]+ steps/s")
        term.wait_for(lambda s: header.search(s), 60, "the view's header with the job's numbers")
        t0 = time.monotonic()
        # Named in the line printed above the table at once, and marked in the table at its next
        # redraw (every 0.5 s): both on screen within the bound.
        marked = re.compile(r"^localhost ◀ straggler\s+0-1\s+\d+", re.M)
        named = "straggler: rank 1 on localhost keeps the others waiting"
        screen = term.wait_for(lambda s: named in s and marked.search(s), 15, "the straggler named and marked")
        assert time.monotonic() - t0 < 10.0
        assert re.search(r"^host\s+ranks\s+step\s+steps/s\s+samples/s\s+comm\s+late ms/step", screen, re.M)
        term.type("r", enter=False)
        screen = term.wait_for(lambda s: re.search(r"^\s+rank\s+0\s+\d+", s, re.M) and
                               re.search(r"^\s+rank ◀ straggler\s+1\s+\d+", s, re.M), 5, "a row per rank after r")
        screen = term.wait_for(lambda s: re.search(r"^EXIT=\d+", s, re.M), 90, "the job's end")
        assert re.search(r"^EXIT=0$", screen, re.M), screen
        history = term.history()
        check_output_lines(history, 2, 20)
        assert re.search(r"appliance launch: summary: \d+/200 steps in \d+s, [\d.]+ steps/s, .*top straggler rank 1 "
                         r"on localhost \(the others waited [\d.]+ s for it\)", history), history[-3000:]
        assert "appliance launch: record of job" in history
        term.type("stty -a | tr ' ;' '\\n\\n' | grep -x -- '-\\?icanon'")
        term.wait_for(lambda s: re.search(r"^icanon$", s, re.M), 5, "the terminal back in canonical mode")
    assert (rec / "report.png").stat().st_size > 10000
    assert json.loads((rec / "live.json").read_text())["ended"] is not None


def run_off_terminal(tmp_path, *flags: str, env: dict) -> tuple[str, str]:
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "wb") as o, open(err, "wb") as e:
        p = subprocess.run(launch_argv(*flags, steps=100), stdout=o, stderr=e, stdin=subprocess.DEVNULL,
                           env={**os.environ, **env}, timeout=120, cwd=str(tmp_path))
    assert p.returncode == 0, err.read_text()
    return out.read_text(), err.read_text()


def test_summary_lines_off_a_terminal_and_no_false_alarm(tmp_path):
    out, err = run_off_terminal(tmp_path, env={"APPLIANCE_RECORD_DIR": str(tmp_path / "rec"),
                                               "APPLIANCE_VIEW_INTERVAL": "1", "APPLIANCE_METRICS_INTERVAL": "0.5"})
    check_output_lines(out, 2, 10)
    lines = [l for l in err.splitlines() if re.match(r"appliance launch: job \w+ · 2/2 ranks on 1 host · step ", l)]
    assert len(lines) >= 2, err
    assert "straggler" not in err
    assert "\x1b[" not in out + err  # no terminal control off a terminal
    assert re.search(r"^appliance launch: summary: \d+/100 steps", err, re.M), err


def test_no_view(tmp_path):
    out, err = run_off_terminal(tmp_path, "--no-view", env={"APPLIANCE_RECORD_DIR": str(tmp_path / "rec"),
                                                            "APPLIANCE_VIEW_INTERVAL": "1"})
    check_output_lines(out, 2, 10)
    assert " · step " not in err and "summary:" in err  # no view; the job's summary and record stay
    assert (tmp_path / "rec" / "metrics.jsonl").stat().st_size > 0


def test_elastic_rounds_in_the_view_and_the_record(tmp_path):
    rec = tmp_path / "rec"
    argv = [sys.executable, "-m", "appliance", "launch", "-np", "2", "--min-np", "2", "-H", "localhost:2",
            "--launcher", "local", "--", sys.executable, WORKER, "60", "40"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                       env={**os.environ, "APPLIANCE_RECORD_DIR": str(rec), "APPLIANCE_VIEW_INTERVAL": "1",
                            "APPLIANCE_METRICS_INTERVAL": "0.5"})
    assert p.returncode == 0, p.stderr
    assert re.search(r"^appliance launch: job \w+ · 2/2 ranks on 1 host · round 1 · step ", p.stderr, re.M), p.stderr
    rows = [json.loads(l) for l in (rec / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows if r["kind"] == "round"] == [1]
    assert "round 1 formed: 2 ranks" in [r["text"] for r in rows if r["kind"] == "event"]
