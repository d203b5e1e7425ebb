"""The elastic fault soak's short form: ``benchmarks/elastic_soak.py --minutes 1.5 --each-kind-once
--settle 0.5 1`` trains one elastic job on this machine and three simulated hosts (network namespaces, real sshd)
while it kills a rank, SIGSTOPs a host's ranks, cuts a host's network, removes a host from
discovery and adds one, each kind once, each after 0.5-1 s of training at full size (at least two
commits: 4 steps of 0.05 s each), then it stops injecting and takes the end's resources. Asserted from its JSON: every fault recovered within the
script's bound (heartbeat timeout + 60 s), no committed step lost, every round started from a
committed state, the ranks agreed at every step, the final model equals a one-process replay of
its committed sizes, nothing grew between the start and the end (processes, the launcher's fds
and threads, /dev/shm; RSS within 10 %) and nothing was left after the job. Recovery times are
printed, not asserted (the long form's targets are for a quiet machine). The script runs in its
own session: on a timeout it and everything it started are killed, and its namespaces removed. The soak's checker itself is
tested on logs written here: it finds a lost commit, a round that resumed from no commit, and
ranks that disagree.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from fixtures import ROOT, netns

BENCH = ROOT / "benchmarks"

pytestmark = [pytest.mark.ssh]
sys.path.insert(0, str(BENCH))
import elastic_soak_checks  # noqa: E402  (benchmarks/ is scripts, not a package)


def namespaces(pid: int) -> list[str]:
    lines = netns.sh("ip", "netns", "list", check=False).stdout.splitlines()
    return [line.split()[0] for line in lines if line.startswith(f"{netns.PREFIX}{pid}x")]


def kill_left(stdout: str) -> None:
    """The launcher and workers of a soak that had to be killed (their own sessions): every process
    whose command line names its work directory."""
    work = next((line.split(": ", 1)[1] for line in stdout.splitlines() if line.startswith("[soak] work directory: ")),
                None)
    if not work:
        return
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if work.encode() in f.read():
                    os.kill(int(d), signal.SIGKILL)
        except (OSError, ValueError):
            pass


@pytest.mark.slow
@pytest.mark.timeout(540)
def test_elastic_soak_short_form(request, tmp_path):
    why = netns.available()
    if why:
        if request.config.getoption("--strict-prereqs", default=False):
            pytest.fail(f"SSH tier: {why}")
        pytest.skip(f"SSH tier: {why}")
    out = tmp_path / "soak.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_", "OMPI_", "PMIX_"))}
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.Popen([sys.executable, str(BENCH / "elastic_soak.py"), "--minutes", "1.5", "--each-kind-once",
                          "--settle", "0.5", "1", "--seed", "7", "--json", str(out)], env=env, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=420)
    finally:
        if p.poll() is None:  # SIGTERM: it cleans up itself; then whatever is left of it, by force
            p.send_signal(signal.SIGTERM)
            try:
                stdout, stderr = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                stdout, stderr = p.communicate()
            kill_left(stdout)
            netns.remove_stale()
    print(stdout)
    assert out.exists(), f"no JSON; exit {p.returncode}:\n{stdout[-3000:]}\n{stderr[-3000:]}"
    r = json.loads(out.read_text())
    tail = f"\n{stdout[-4000:]}\n{stderr[-2000:]}"
    assert {k: v["injected"] for k, v in r["kinds"].items() if v["injected"] == 0} == {}, tail
    assert [f for f in r["faults"] if not f.get("recovered")] == [], tail
    assert len(r["jobs"]) == 1 and r["jobs"][0]["exit"] == 0, (r["jobs"], tail)
    for c in r["checks"]:
        assert c["committed_steps_lost"] == 0, (c["lost_at"], tail)
        assert c["not_from_a_commit"] == [] and c["start_disagree"] == [], (c, tail)
        assert c["rounds_from_a_commit"] == c["rounds"] >= len(r["faults"]) + 1, (c, tail)
        assert c["digest_disagree"] == 0, tail
        assert c["final"] and c["final"]["equals_replay"], (c["final"], tail)
    assert all(r["resource_ok"].values()), (r["resources"], tail)
    assert p.returncode == 0, tail
    assert namespaces(p.pid) == [], "namespaces left behind"


def test_the_checker_finds_a_lost_commit_a_state_from_no_commit_and_disagreeing_ranks(tmp_path):
    lines: dict[int, list[dict]] = {0: [], 1: []}

    def ev(**kw):
        lines[kw["w"]].append(kw)

    for w in (0, 1):
        ev(ev="start", w=w, t=1.0, round=1, step=0, sum="init", size=2, rank=w)
    for s in range(1, 9):  # commits at 4 and 8; worker 1 logs another state at step 3
        for w in (0, 1):
            ev(ev="step", w=w, t=1.0 + s, round=1, step=s, sum="bad" if (w, s) == (1, 3) else f"s{s}",
               commit=s % 4 == 0, size=2, rank=w)
    ev(ev="start", w=0, t=20.0, round=2, step=4, sum="s4", size=1, rank=0)   # the survivor committed 8
    ev(ev="step", w=0, t=21.0, round=2, step=5, sum="x5", commit=False, size=1, rank=0)
    for w, evs in lines.items():
        (tmp_path / f"log.{w}").write_text("".join(json.dumps(e) + "\n" for e in evs))
    r = elastic_soak_checks.check_job(tmp_path)
    assert r["committed_steps_lost"] == 4 and r["lost_at"] == [{"round": 2, "resumed_at": 4, "last_commit": 8}]
    assert r["digest_disagree"] == 1 and r["rounds"] == 2 and r["not_from_a_commit"] == []
    # a round that starts from a state no commit had
    ev(ev="start", w=0, t=30.0, round=3, step=8, sum="other", size=1, rank=0)
    (tmp_path / "log.0").write_text("".join(json.dumps(e) + "\n" for e in lines[0]))
    r = elastic_soak_checks.check_job(tmp_path)
    assert r["not_from_a_commit"] == [{"round": 3, "step": 8}] and r["rounds_from_a_commit"] == 2
