"""The metrics a rank publishes (appliance/runtime/metrics.py), on real ranks over real TCP.

A plain socket server in the test (tests/fixtures/metrics_listener.py) stands in for the
launcher's collector. Checked: the hello (rank, size, host, round, pid, the HMAC of the job
secret) and the samples of 2 and 3 ranks, whose counters grow as collectives run and end at
what the ranks ran (counts and bytes per kind, explicit steps and samples); late_s names the
rank that sleeps before its allreduce, and only it, with the tree and the star negotiation;
nothing is sent (no thread runs) when APPLIANCE_METRICS_ADDR is unset; a collector that dies
mid-job never stalls or fails the job (one warning line per rank at most); bye at shutdown.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets

import pytest

from fixtures import RANKS
from fixtures.metrics_listener import Listener
from rank_group import RankGroup

WORKER = RANKS / "metrics_worker.py"
F32 = 4


def group(tmp_path, np, *args, listener=None, env=None, linger=False):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    if linger:
        (out / "linger").write_text("1")
    e = {"APPLIANCE_METRICS_INTERVAL": "0.1", **(env or {})}
    if listener is not None:
        e["APPLIANCE_METRICS_ADDR"] = listener.addr
    return RankGroup(np, str(args[0]), *args[1:], out=out, env=e, worker=WORKER)


def final_samples(lst, g, np, steps):
    """Wait until every rank sent a sample with its final allreduce count; return them by rank."""
    g.wait_for_file("rank*.json", 60, np)

    def done(ls):
        return all(any(s["ops"].get("allreduce", {}).get("n") == steps for s in ls.of("sample", r)) for r in range(np))

    lst.wait_for(done, 30, "final samples")
    return {r: lst.of("sample", r) for r in range(np)}


@pytest.mark.parametrize("np", [2, 3])
def test_hello_samples_and_counters(tmp_path, np):
    steps, secret = 30, secrets.token_hex(16)  # 20 ms steps: several samples go out while the loop runs
    with Listener() as lst, group(tmp_path, np, steps, -1, 0, 20, listener=lst, linger=True,
                                  env={"APPLIANCE_JOB_SECRET": secret, "HOROVOD_HOSTNAME": "nodeA"}) as g:
        by_rank = final_samples(lst, g, np, steps)
        g.touch("release")
        assert g.wait(60) == [0] * np, g.all_stderr()
        lst.wait_for(lambda ls: len(ls.of("bye")) == np, 10, "bye from every rank")
        want_auth = hmac.new(bytes.fromhex(secret), b"appliance-metrics", hashlib.sha256).hexdigest()
        for r in range(np):
            (hello,) = lst.of("hello", r)
            rep = g.report(r)
            assert hello == {"v": 1, "kind": "hello", "job": f"test-{g.store_port}", "rank": r, "size": np,
                             "local_rank": r, "host": "nodeA", "round": 0, "pid": rep["pid"], "auth": want_auth}
            samples = by_rank[r]
            assert len(samples) >= 3
            for a, b in zip(samples, samples[1:]):  # cumulative: never going back
                assert b["t"] >= a["t"] and b["step"] >= a["step"] and b["busy_s"] >= a["busy_s"]
                for kind, c in a["ops"].items():
                    assert b["ops"][kind]["n"] >= c["n"] and b["ops"][kind]["bytes"] >= c["bytes"]
            assert any(0 < s["step"] < steps for s in samples), "no sample while the loop ran"
            last = samples[-1]
            assert last["v"] == 1 and last["round"] == 0 and last["rank"] == r
            assert (last["step"], last["step_src"], last["samples"], last["total_steps"]) == (steps, "explicit", 8 * steps, None)
            ops = last["ops"]
            assert set(ops) == {"allreduce", "allgather", "broadcast"}
            assert ops["allreduce"]["n"] == steps and ops["allreduce"]["bytes"] == steps * 4096 * F32
            assert ops["allgather"]["bytes"] == steps * np * 3 * 4  # the gathered output
            assert ops["broadcast"]["bytes"] == steps * 16 * 8
            assert all(c["s"] > 0 for c in ops.values())
            assert last["ops"] == rep["metrics"]["ops"]  # the sample after the loop has the core's final counters
            assert 0 < last["busy_s"] < last["wall_s"] and 0 <= last["wait_s"] <= last["busy_s"]
            assert last["rss"] > 10 << 20 and last["gpu_util"] is None and last["gpu_mem"] is None
            assert "warning" not in g.stderr(r).lower()
        assert not lst.raw


@pytest.mark.parametrize("negotiation", ["tree", "star"])
def test_late_names_the_rank_that_sleeps(tmp_path, negotiation):
    np, steps, slow, slow_ms = 3, 20, 2, 30
    with Listener() as lst, group(tmp_path, np, steps, slow, slow_ms, 0, listener=lst, linger=True,
                                  env={"APPLIANCE_NEGOTIATION": negotiation}) as g:
        by_rank = final_samples(lst, g, np, steps)
        g.touch("release")
        assert g.wait(60) == [0] * np, g.all_stderr()
        late = {r: by_rank[r][-1]["late_s"] for r in range(np)}
        wait = {r: by_rank[r][-1]["wait_s"] for r in range(np)}
        expected = steps * slow_ms / 1000
        assert late[slow] >= 0.6 * expected, (late, wait)
        assert late[slow] <= 2 * expected + 1, (late, wait)
        for r in range(np):
            if r != slow:
                assert late[r] < 0.2 * late[slow], (late, wait)
                assert wait[r] >= 0.6 * expected, (late, wait)  # they waited for it
        assert wait[slow] < 0.5 * min(wait[r] for r in range(np) if r != slow), (late, wait)


def test_nothing_sent_without_the_address(tmp_path):
    with Listener() as lst, group(tmp_path, 2, 10, -1, 0, 0) as g:
        assert g.wait(60) == [0, 0], g.all_stderr()
        for r in range(2):
            assert "appliance-metrics" not in g.report(r)["threads"]
            assert g.report(r)["metrics"]["ops"]["allreduce"]["n"] == 10  # counted all the same (cheaply)
        assert lst.lines == [] and lst.raw == []


def test_dead_listener_never_stalls_training(tmp_path):
    np, steps = 2, 150  # ~3 s of 20 ms steps
    with Listener() as lst, group(tmp_path, np, steps, -1, 0, 20, listener=lst) as g:
        lst.wait_for(lambda ls: all(ls.of("sample", r) for r in range(np)), 60, "a first sample from every rank")
        lst.kill()  # the collector dies mid-job: sends fail, reconnects are refused
        assert g.wait(90) == [0] * np, g.all_stderr()
        for r in range(np):
            assert g.report(r)["metrics"]["ops"]["allreduce"]["n"] == steps
            warnings = [l for l in g.stderr(r).splitlines() if l.startswith("appliance: metrics:")]
            assert len(warnings) == 1, g.stderr(r)  # said once, however many sends failed
            assert "Traceback" not in g.stderr(r)


def test_a_reinit_says_hello_again_and_keeps_counting(tmp_path):
    """shutdown() then init() (what an elastic reset does): a new connection and hello, counters
    and steps going on from where they were, a bye for each."""
    import os
    import subprocess
    import sys

    from fixtures import ROOT

    script = ("import numpy as np, appliance.runtime as rt\n"
              "from appliance.runtime import metrics\n"
              "for _ in range(2):\n"
              "    rt.init()\n"
              "    for _ in range(3):\n"
              "        rt.allreduce(np.ones(8, np.float32)); metrics.note_step('explicit')\n"
              "    rt.shutdown()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_", "OMPI_"))}
    with Listener() as lst:
        env.update(PYTHONPATH=str(ROOT), APPLIANCE_METRICS_ADDR=lst.addr, APPLIANCE_METRICS_INTERVAL="5")
        proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=60, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        lst.wait_for(lambda ls: len(ls.of("bye")) == 2, 10, "two byes")
        assert [c for c, m in lst.lines if m["kind"] == "hello"] == [0, 1]  # one connection per init
        last = [m for m in lst.of("sample")]
        assert [(m["step"], m["ops"]["allreduce"]["n"], m["ops"]["allreduce"]["bytes"]) for m in last] == \
            [(3, 3, 96), (6, 6, 192)]  # the last sample of each init: cumulative across both
        assert last[1]["wall_s"] > last[0]["wall_s"]
