#!/usr/bin/env python3
"""Start-up cost under OpenMPI's mpirun (the ranks bootstrap through PMIx) against `appliance launch`.

    python benchmarks/startup_mpirun.py                  # 2, 8, 32 ranks, median of 5 runs each
    python benchmarks/startup_mpirun.py --quick          # 2 ranks, 1 run
    python benchmarks/startup_mpirun.py --ranks 2,8 --runs 3 --json out.json

Every rank is ``import appliance.runtime``, ``init()``, one allreduce of one float, ``shutdown()``,
on this machine (oversubscribed when the ranks outnumber the cores). Per run: ``init`` to the
first allreduce's end (the slowest rank: what the bootstrap costs the job), and the whole command's
wall time; separately mpirun's own start and stop with nothing to bootstrap (``mpirun -np N
sleep 1``, less the second: OpenMPI 4.1's mpirun can hang when 32 ranks that do nothing exit at
once; a run that hangs is killed after 120 s and retried). The target: mpirun's wall time within
1.5x `appliance launch`'s plus mpirun's own.

Scheduling: `appliance launch` starts each rank in a session of its own; on Linux with
autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``) each session is a
scheduling group, so on a machine busy with other work N such ranks get N shares of the CPUs,
while mpirun's ranks (one session) share one. So that the columns compare the bootstraps and not
the scheduler, each mpirun rank runs under ``setsid -w`` (its own session, as the launcher's);
``--as-is`` measures mpirun's ranks in mpirun's session.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import benchlib as bl

WORKER = r"""
import json, time
import numpy as np
import appliance.runtime as rt
t0 = time.monotonic()
rt.init()
rt.allreduce(np.ones(1, np.float32), name="first")
print("STARTUP " + json.dumps({"rank": rt.rank(), "init_s": time.monotonic() - t0}), flush=True)
rt.shutdown()
"""


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_", "OMPI_", "PMIX_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HOROVOD_START_TIMEOUT="300")
    return env


def timed(argv: list, n: int, with_ranks: bool = True) -> tuple[float, float]:
    """Wall time of ``argv`` and the slowest rank's init-to-first-allreduce (0 without ranks)."""
    for attempt in range(3):
        start = time.monotonic()
        proc = subprocess.Popen(argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=120)
            break
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            print(f"{argv[0]} {' '.join(argv[1:5])}...: hung, killed after 120 s; again", file=sys.stderr, flush=True)
    else:
        raise SystemExit(f"{argv[:6]}... hung three times")
    wall = time.monotonic() - start
    p = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    if p.returncode != 0:
        raise SystemExit(f"{argv[:6]}... exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
    inits = [json.loads(m)["init_s"] for m in re.findall(r"STARTUP (\{[^}]*\})", p.stdout)]
    if with_ranks and len(inits) != n:
        raise SystemExit(f"{len(inits)} of {n} ranks reported:\n{(p.stdout + p.stderr)[-3000:]}")
    return wall, max(inits, default=0.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,8,32", help="comma list of rank counts (default 2,8,32)")
    p.add_argument("--runs", type=int, default=5, help="runs per cell; the median is reported (default 5)")
    p.add_argument("--quick", action="store_true", help="2 ranks, 1 run")
    p.add_argument("--as-is", action="store_true",
                   help="mpirun's ranks in mpirun's session (no setsid -w; see the scheduling note)")
    p.add_argument("--json", help="write every number here")
    a = p.parse_args(argv)
    sizes = [2] if a.quick else [int(x) for x in a.ranks.split(",")]
    runs = 1 if a.quick else a.runs
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    py = [sys.executable, "-c", WORKER]
    own = [] if a.as_is else ["setsid", "-w"]
    print(f"start-up: init to the first allreduce (slowest rank) and the command's wall time, median of {runs}; "
          + bl.machine_line())
    rows = []
    for n in sizes:
        cells = {"mpirun": ["mpirun", *root, "-np", str(n), "--oversubscribe", "-bind-to", "none", *own, *py],
                 "launch": [sys.executable, "-m", "appliance", "launch", "-np", str(n), *py],
                 "mpirun alone": ["mpirun", *root, "-np", str(n), "--oversubscribe", "-bind-to", "none", "sleep", "1"]}
        got: dict = {k: [] for k in cells}
        for _ in range(runs):  # interleaved, so a change of load hits every column alike
            for k, cmd in cells.items():
                got[k].append(timed(cmd, n, with_ranks=k != "mpirun alone"))
                print(f"{n} ranks, {k}: {got[k][-1][0]:.2f} s", file=sys.stderr, flush=True)  # progress
        med = {k: (statistics.median(w for w, _ in v), statistics.median(i for _, i in v)) for k, v in got.items()}
        row = {"ranks": n, "runs": runs,
               "mpirun_wall_s": med["mpirun"][0], "mpirun_init_s": med["mpirun"][1],
               "launch_wall_s": med["launch"][0], "launch_init_s": med["launch"][1],
               "mpirun_alone_s": max(0.0, med["mpirun alone"][0] - 1.0), "ranks_in_own_session": not a.as_is}
        budget = 1.5 * row["launch_wall_s"] + row["mpirun_alone_s"]
        row["target_met"] = row["mpirun_wall_s"] <= budget
        rows.append(row)
    print(f"{'ranks':>5} | {'mpirun init':>11} | {'launch init':>11} | {'mpirun wall':>11} | {'launch wall':>11} | "
          f"{'mpirun alone':>12} | wall within 1.5x launch + mpirun's own")
    for r in rows:
        print(f"{r['ranks']:>5} | {r['mpirun_init_s']:>10.2f}s | {r['launch_init_s']:>10.2f}s | "
              f"{r['mpirun_wall_s']:>10.2f}s | {r['launch_wall_s']:>10.2f}s | {r['mpirun_alone_s']:>11.2f}s | "
              + ("yes" if r["target_met"] else "NO"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": bl.machine_line(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
