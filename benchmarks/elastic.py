"""Elastic recovery times: how long an elastic job takes to train again at its new size.

    sudo .venv/bin/python benchmarks/elastic.py [--runs 5] [--json FILE]   # local and SSH hosts (root)
    .venv/bin/python benchmarks/elastic.py --quick                          # CI smoke: local hosts, 1 run

Every case runs a real elastic job (``appliance.launcher.launch`` with the driver) of
``tests/ranks/elastic_steps.py`` (a numpy "training": one allreduce per step, a commit every 2
steps, 20 ms between steps) and measures, per run:
- kill: from SIGKILL of one rank (a visible death) to the survivors' first completed step at the
  new size;
- cut (SSH hosts only): from the network cut of a host (its switch port down: nothing closes) to
  the survivors' first completed step at the new size, with APPLIANCE_HEARTBEAT_TIMEOUT=2;
- add: from a new host appearing in the discovery script's output to the new rank's first
  completed step, and the new worker's own start (its process start to its imports done: Python,
  numpy and the appliance), which the target excludes.
Hosts: ``local`` = loopback addresses of this machine (127.0.0.x, kept apart by the elastic
driver); ``ssh`` = the SSH tier's network-namespace hosts with real sshd (tests/fixtures/netns.py)
plus this machine. Prints the median and the range of each; ``--json`` writes every sample.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
import tempfile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from fixtures.elastic import ElasticJob  # noqa: E402

STEP_S = 0.02


def first_step_at(job: ElasticJob, size: int, after: float, limit: float = 60.0, worker: int | None = None) -> float:
    """Wall time of the first step at ``size`` completed after ``after`` (by ``worker``, or anyone)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        times = [p["t"] for w, p in job.progress().items()
                 if p["size"] == size and p["t"] > after and (worker is None or w == worker)]
        if times:
            return min(times)
        time.sleep(0.01)
    raise SystemExit(f"no step at size {size} within {limit} s: {job.progress()}")


def stop(job: ElasticJob) -> None:
    """End the job cleanly: every worker stops after the same step."""
    (job.out / "stop").write_text(str(job.max_step() + 10))
    r = job.wait(120)
    if r.returncode != 0:
        raise SystemExit(f"the job failed: {r.reason}")


def kill_case(out: Path, hosts: str, victim: int, **kw) -> float:
    with ElasticJob(out, steps=100000, commit=2, step_s=STEP_S) as job:
        job.start(3, min_np=2, hosts=hosts, timeout=120, **kw)
        job.wait_for(lambda: job.max_step() >= 20, what="steps at 3 ranks")
        t0 = time.time()
        os.kill(job.pids()[victim], signal.SIGKILL)
        took = first_step_at(job, 2, t0) - t0
        stop(job)
        return took


def add_case(out: Path, first: str, added: str, **kw) -> tuple[float, float]:
    with ElasticJob(out, steps=100000, commit=2, step_s=STEP_S, hosts=first) as job:
        job.start(1, max_np=2, timeout=120, **kw)
        job.wait_for(lambda: job.max_step() >= 20, what="steps at 1 rank")
        t0 = time.time()
        job.set_hosts(f"{first},{added}")
        took = first_step_at(job, 2, t0, worker=1) - t0
        own = json.loads((out / "born.1").read_text())["own_start"]
        stop(job)
        return took, own


def cut_case(out: Path, cluster, heartbeat: float, **kw) -> float:
    from fixtures.netns import sh

    h1, h2 = cluster.hosts
    with ElasticJob(out, steps=100000, commit=2, step_s=STEP_S) as job:
        job.start(3, min_np=2, hosts=f"localhost:1,{h1.address}:1,{h2.address}:1", timeout=120,
                  env={"APPLIANCE_HEARTBEAT_TIMEOUT": str(heartbeat)}, **kw)
        port = f"sw{h2.index}"
        try:
            job.wait_for(lambda: job.max_step() >= 20, what="steps at 3 ranks")
            sh("ip", "-n", cluster.switch, "link", "set", port, "down")
            t0 = time.time()
            took = first_step_at(job, 2, t0) - t0
            stop(job)
        finally:
            sh("ip", "-n", cluster.switch, "link", "set", port, "up", check=False)
        return took


def summary(name: str, samples: list[float]) -> str:
    return (f"{name:<34} median {statistics.median(samples):6.2f} s   range {min(samples):.2f}-{max(samples):.2f} s"
            f"   ({len(samples)} runs)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="local hosts only, one run each (CI smoke)")
    ap.add_argument("--json", help="write every sample here")
    args = ap.parse_args()
    runs = 1 if args.quick else args.runs
    os.environ.update(APPLIANCE_DISCOVERY_INTERVAL="1.0", APPLIANCE_STOP_GRACE="1", APPLIANCE_FAILURE_GRACE="1")
    results: dict[str, list] = {}
    base = Path(tempfile.mkdtemp(prefix="appliance-elastic-bench-"))

    def out() -> Path:
        d = base / f"run{sum(len(v) for v in results.values())}"
        d.mkdir()
        return d

    a, b, c = "127.0.0.2", "127.0.0.3", "127.0.0.4"
    for _ in range(runs):
        results.setdefault("local: kill of a rank", []).append(kill_case(out(), f"{a}:1,{b}:1,{c}:1", victim=2))
        took, own = add_case(out(), f"{a}:1", f"{b}:1")
        results.setdefault("local: host added", []).append(took)
        results.setdefault("local: new worker's own start", []).append(own)
    if not args.quick:
        if os.geteuid() != 0:
            print("SSH hosts need root (network namespaces): only the local cases ran", file=sys.stderr)
        else:
            from fixtures import netns

            with netns.keyed_cluster(2, "appliance-elastic-bench-") as (cluster, home, shared, _):
                os.environ.update(APPLIANCE_SHARED=str(shared), HOME=str(home))
                h1, h2 = cluster.hosts
                for _ in range(runs):
                    results.setdefault("ssh: kill of a remote rank", []).append(
                        kill_case(out(), f"localhost:1,{h1.address}:1,{h2.address}:1", victim=2, ssh_port=netns.PORT))
                    took, own = add_case(out(), f"localhost:1", f"{h1.address}:1", ssh_port=netns.PORT)
                    results.setdefault("ssh: host added", []).append(took)
                    results.setdefault("ssh: new worker's own start", []).append(own)
                    results.setdefault("ssh: network cut (heartbeat 2 s)", []).append(
                        cut_case(out(), cluster, 2.0, ssh_port=netns.PORT))
    for name, samples in results.items():
        print(summary(name, samples))
    if args.json:
        Path(args.json).write_text(json.dumps({"step_s": STEP_S, "samples": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
