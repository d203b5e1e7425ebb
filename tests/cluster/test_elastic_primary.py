"""``appliance primary --min-np`` without -H: the job's hosts are the secondaries registered on the
shared mount. A secondary container is killed mid-training and a new one started; the job goes
on to the end at the sizes that follow, reaches the trajectory of a static run (no committed step
lost), and nothing is left behind.

Measured on the way (printed; ``-s`` shows them): from the kill to the survivors' first
collective at the new size (the ``training ... from epoch`` line rank 0 prints after it), and
from the new secondary's registration (its record's ``started``) to its rank's first collective
(the ``devices:`` line naming it).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest
from fixtures import RANKS
from fixtures.waits import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(420, func_only=True)]


class Output:
    """The primary's merged output, line by line, with the wall-clock time each line arrived."""

    def __init__(self, proc):
        self.proc, self.lines, self._lock = proc, [], threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append((time.time(), line.rstrip("\n")))

    def first(self, pattern: str, after: float = 0.0):
        """(time, line) of the first line matching ``pattern`` that arrived after ``after``, or None."""
        with self._lock:
            return next(((t, s) for t, s in self.lines if t >= after and re.search(pattern, s)), None)

    def text(self) -> str:
        with self._lock:
            return "\n".join(s for _, s in self.lines)

    def wait(self, pattern: str, timeout: float, what: str, after: float = 0.0):
        """(time, line) of the first line matching ``pattern`` after ``after``; failing, at the
        bound or when the primary ended first, with its output."""
        deadline = time.monotonic() + timeout
        while (found := self.first(pattern, after)) is None:
            ended = self.proc.poll() is not None
            if ended:
                self.thread.join(timeout=10)
                if (found := self.first(pattern, after)) is not None:
                    return found
            if ended or time.monotonic() > deadline:
                why = f"the primary exited ({self.proc.returncode})" if ended else f"not within {timeout} s"
                raise AssertionError(f"{what}: {why}; its output:\n{self.text()[-6000:]}")
            time.sleep(0.1)
        return found


def _registered(cluster, host: str):
    path = os.path.join(cluster.shared, "secondaries", f"{cluster.host(host)}.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def test_an_elastic_primary_trains_on_while_a_secondary_is_killed_and_another_starts(cluster):
    c = cluster
    c.secondary("node2")
    c.secondary("node3")
    wait_for(lambda: _registered(c, "node2") and _registered(c, "node3"), 30, "both secondaries registered")
    p = c.start("primary", "--network", c.network, "-np", "2", "--min-np", "1", "--max-np", "2",
                "--", "python", "-m", "train", "--fresh", "--epochs", "6", "--step-time", "0.2")
    out = Output(p)

    try:
        n2, n3, n4 = c.host("node2"), c.host("node3"), c.host("node4")
        out.wait(rf"devices: rank 0 cpu@{n2}, rank 1 cpu@{n3}", 120,
                 "two ranks on node2 and node3 (the older registration first)")
        out.wait(r"epoch 1/6", 60, "epoch 1")

        killed_at = time.time()
        c.container("node3").kill()  # SIGKILL: its rank and sshd vanish at once
        out.wait(r"membership changed: 1 rank\(s\) now", 60, "the survivor resets", killed_at)
        resumed_at, _ = out.wait(r"training an MLP .* with 1 rank\(s\) from epoch", 60, "the survivor goes on alone",
                                 killed_at)

        c.secondary("node4")
        joined_at, _ = out.wait(rf"devices: rank 0 cpu@{n2}, rank 1 cpu@{n4}", 120, "node4's rank joins", resumed_at)
        registered = _registered(c, "node4")
        assert registered and registered["slots"] == 1

        rc = p.wait(timeout=240)
        out.thread.join(timeout=30)
        text = out.text()
        assert rc == 0, text[-4000:]
        # the membership it went through: 2 ranks, 1 (node3 killed), 2 again (node4 joined)
        sizes = [int(m) for m in re.findall(r"membership changed: (\d+) rank", text)]
        assert sizes == [1, 2], text[-4000:]
        assert re.search(r"round 2: 1 rank \(-1\) on " + n2, text), text[-4000:]
        assert re.search(rf"round 3: 2 ranks \(\+1\) on {n2}, {n4}", text), text[-4000:]
        final = re.search(r"final accuracy (\d\.\d+) after 6 epochs", text)
        assert final and float(final.group(1)) >= 0.90, text[-4000:]
        told = out.first(r"hosts changed \(added\)", resumed_at)
        print(f"\n[elastic primary] kill -> survivor resumed: {resumed_at - killed_at:.2f} s; "
              f"node4 registered -> its worker started and the ranks told: {told[0] - registered['started']:.2f} s "
              f"-> its rank in: {joined_at - registered['started']:.2f} s", file=sys.stderr)

        # nothing left behind: no primary container, no job process in any live secondary
        assert [x.name for x in c.ours() if "primary" in x.name] == []
        assert c.job_python("node2") == [] and c.job_python("node4") == []
    finally:
        if p.poll() is None:
            p.kill()
    # No committed step lost: a static run on two hosts follows the same trajectory (the global
    # batch is fixed, so the sizes 2, 1, 2 and a rollback to the last commit change nothing).
    static = c.primary("-np", "2", "-H", f"{n2}:1,{n4}:1", "--", "python", "-m", "train", "--fresh", "--epochs", "6",
                       "--run", "static", timeout=180)
    assert static.returncode == 0, static.stdout[-4000:]
    elastic_m, static_m = (json.load(open(os.path.join(c.shared, "models", run, "metrics.json")))["epochs"]
                           for run in ("digits", "static"))
    assert [m["size"] for m in static_m] == [2] * 6 and len(elastic_m) == 6
    for a, b in zip(elastic_m, static_m):
        assert abs(a["loss"] - b["loss"]) < 1e-3 and abs(a["accuracy"] - b["accuracy"]) <= 2 / 297, (a, b)
    for host in ("node2", "node3", "node4"):
        res = c.run("secondary", "--stop", "--network", c.network, "--name", c.host(host), timeout=120)
        assert res.returncode == 0, res.stdout
        assert _registered(c, host) is None
    assert c.ours() == []


def test_a_secondary_stopped_mid_training_leaves_at_a_commit_and_the_job_goes_on(cluster):
    """``appliance secondary --stop`` of the host that holds rank 0: it unregisters, its rank leaves
    at the next commit (exit 0, no blacklist), the stop returns once it has left (well within its
    20 s bound), the other host's worker becomes rank 0 and writes the checkpoints under the run's
    lock, and the job finishes."""
    c = cluster
    c.secondary("node2")
    c.secondary("node3")
    wait_for(lambda: _registered(c, "node2") and _registered(c, "node3"), 30, "both secondaries registered")
    p = c.start("primary", "--network", c.network, "-np", "2", "--min-np", "1", "--max-np", "2",
                "--", "python", "-m", "train", "--fresh", "--epochs", "3", "--step-time", "0.2")
    out = Output(p)
    try:
        n2, n3 = c.host("node2"), c.host("node3")
        out.wait(rf"devices: rank 0 cpu@{n2}, rank 1 cpu@{n3}", 120, "two ranks on node2 and node3")
        out.wait(r"epoch 1/3", 60, "epoch 1")
        t0 = time.monotonic()
        res = c.run("secondary", "--stop", "--network", c.network, "--name", n2, timeout=120)
        took = time.monotonic() - t0
        assert res.returncode == 0, res.stdout
        assert took < 15, f"the stop took {took:.1f} s: it waited out its bound instead of the rank's leaving"
        assert _registered(c, "node2") is None
        out.wait(rf"devices: rank 0 cpu@{n3}$", 60, "node3's worker goes on as rank 0")
        rc = p.wait(timeout=240)
        out.thread.join(timeout=30)
        text = out.text()
        assert rc == 0, text[-4000:]
        assert re.search(rf"leaves the elastic job: host {n2} is no longer part of the job", text), text[-4000:]
        assert re.search(r"hosts changed \(removed\)", text) and "blacklisted" not in text, text[-4000:]
        assert re.search(r"final accuracy (0\.9\d+) after 3 epochs", text), text[-4000:]
        # the checkpoint goes on being written by whichever worker is rank 0, under the run's lock
        with open(os.path.join(c.shared, "models", "digits", "metrics.json")) as f:
            assert [m["size"] for m in json.load(f)["epochs"]] == [2, 1, 1]
        assert not os.path.exists(os.path.join(c.shared, "locks", "run-digits.lock"))
        print(f"\n[elastic primary] appliance secondary --stop of rank 0's host: {took:.2f} s", file=sys.stderr)
    finally:
        if p.poll() is None:
            p.kill()
    res = c.run("secondary", "--stop", "--network", c.network, "--name", c.host("node3"), timeout=120)
    assert res.returncode == 0, res.stdout
    assert c.ours() == [] and _registered(c, "node3") is None


HOROVOD_FAILED = "Horovod detected that one or more processes exited with non-zero status"


def test_every_rank_of_an_elastic_primary_failing_at_once_ends_the_job_within_5_s(cluster):
    """Two secondaries with 2 slots each; all 4 ranks raise RuntimeError at the same step
    (``tests/ranks/elastic_raise_all.py``, run from the shared directory; numpy, not torch: see its
    docstring): the primary exits
    non-zero within 5 s of the last step with Horovod's phrase naming every rank and its exit, and
    nothing is left (no primary container, no job process in the secondaries)."""
    c = cluster
    c.secondary("node2", "--slots", "2")
    c.secondary("node3", "--slots", "2")
    wait_for(lambda: _registered(c, "node2") and _registered(c, "node3"), 30, "both secondaries registered")
    out_dir = os.path.join(c.shared, "failall")
    os.mkdir(out_dir)
    os.chmod(out_dir, 0o777)
    shutil.copy(RANKS / "elastic_raise_all.py", os.path.join(c.shared, "elastic_raise_all.py"))
    p = c.start("primary", "--network", c.network, "-np", "4", "--min-np", "1", "--elastic-timeout", "60",
                "--", "python", "elastic_raise_all.py", out_dir, "6", "0.2")
    out = Output(p)
    n2, n3 = c.host("node2"), c.host("node3")

    def steps() -> dict:
        found = {}
        for name in os.listdir(out_dir):
            if name.startswith("step."):
                try:
                    with open(os.path.join(out_dir, name)) as f:
                        found[name] = json.load(f)
                except (OSError, ValueError):
                    pass
        return found

    try:
        wait_for(lambda: len(steps()) == 4 and min(s["step"] for s in steps().values()) >= 5 or p.poll() is not None,
                 180, "step 5 on all 4 ranks")
        assert p.poll() is None and {s["size"] for s in steps().values()} == {4}, out.text()[-4000:]
        failed = max(s["t"] for s in steps().values())
        try:
            rc = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the primary did not end within 60 s of every rank failing:\n{out.text()[-4000:]}")
        took = time.time() - failed
        out.thread.join(timeout=30)
        text = out.text()
        print(f"\n[elastic primary] every rank failed: the primary returned {took:.2f} s after the last step",
              file=sys.stderr)
        assert rc != 0, text[-4000:]
        line = next((s for s in text.splitlines() if HOROVOD_FAILED in s), None)
        assert line is not None, text[-4000:]
        for rank, host in enumerate((n2, n2, n3, n3)):
            assert f"rank {rank}, host {host}) exited with code 1" in line or \
                f"rank {rank}, host {host}) was killed by signal 15" in line, line
        assert line.count("exited with code 1") >= 2, line
        timed = "\n".join(f"{t - failed:+7.2f} s {s}" for t, s in out.lines[-40:])
        assert took < 5.0, f"{took:.2f} s; the primary's last lines, timed from the last step:\n{timed}"
        assert not any(n.startswith("done.") for n in os.listdir(out_dir))
        assert [x.name for x in c.ours() if "primary" in x.name] == []
        assert c.job_python("node2") == [] and c.job_python("node3") == []
    finally:
        if p.poll() is None:
            p.kill()
