"""The launcher's CPU for a real job of N ranks on simulated SSH hosts, with and without the view.

    python benchmarks/observe_cost_ssh.py [--hosts 4] [--slots 8] [--steps 300] [--runs 3]

What it owns: one comparison. It makes ``--hosts`` network-namespace hosts with sshd (the SSH
tier's ``tests/fixtures/netns.py``; root, iproute2, OpenSSH), then runs ``appliance launch`` of
``tests/ranks/observe_worker.py`` (60 ms steps) on them, alternately with the observer fully on
(summary lines, the record with TensorBoard events, a sample per second per rank) and with
``--no-view``, ``APPLIANCE_RECORD_DIR=off`` (the collector still takes the samples), ``--runs``
times each. Printed per run and as medians: the launcher's CPU seconds (user + system of the
launcher process, ``RUSAGE_CHILDREN``: the ranks run in other namespaces under sshd, not as its
children) and wall seconds.

Env vars: none. Failure modes: a failed job or missing tier tools end the run with their error.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def one(argv: list[str], env: dict) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"the job failed ({p.returncode}): {p.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    from fixtures import netns
    from fixtures.netns import PORT

    a = argparse.ArgumentParser()
    a.add_argument("--hosts", type=int, default=4)
    a.add_argument("--slots", type=int, default=8)
    a.add_argument("--steps", type=int, default=300)
    a.add_argument("--runs", type=int, default=3)
    args = a.parse_args()
    why = netns.available()
    if why:
        raise SystemExit(f"observe_cost_ssh: {why}")
    os.makedirs(os.path.expanduser("~/.cache"), exist_ok=True)
    base = tempfile.mkdtemp(prefix="appliance-observe-cost-", dir=os.path.expanduser("~/.cache"))
    cluster = None
    try:
        shared = os.path.join(base, "share")
        subprocess.run([sys.executable, "-m", "appliance", "keys", "--shared", shared], check=True,
                       capture_output=True, timeout=60)
        cluster = netns.Cluster(args.hosts, shared, base)
        n = args.hosts * args.slots
        hosts = ",".join(f"{h.address}:{args.slots}" for h in cluster.hosts)
        env = {**os.environ, "APPLIANCE_SHARED": shared, "HOME": base, "APPLIANCE_SSH_TIMEOUT": "30",
               "APPLIANCE_VIEW_INTERVAL": "5"}
        worker = [sys.executable, os.path.join(ROOT, "tests", "ranks", "observe_worker.py"), str(args.steps), "60",
                  "-1", "0", "1000000"]
        modes = {"observer on": ([], {"APPLIANCE_RECORD_DIR": os.path.join(base, "rec")}),
                 "--no-view, no record": (["--no-view"], {"APPLIANCE_RECORD_DIR": "off"})}
        results: dict = {m: [] for m in modes}
        for run in range(args.runs):
            for mode, (flags, extra) in modes.items():
                argv = [sys.executable, "-m", "appliance", "launch", "-np", str(n), "-H", hosts, "-p", str(PORT),
                        *flags, "--", *worker]
                cpu, wall = one(argv, {**env, **extra})
                results[mode].append((cpu, wall))
                print(f"run {run + 1}, {mode}: launcher {cpu:.2f} CPU s in {wall:.1f} s", flush=True)
        for mode, rs in results.items():
            print(f"{mode}: {n} ranks on {args.hosts} hosts, {args.steps} steps: median launcher CPU "
                  f"{statistics.median(c for c, _ in rs):.2f} s, median wall {statistics.median(w for _, w in rs):.1f} s")
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
