"""Where a small operation's time goes at 2 ranks: the shm ring's hops, and how ranks wait on them.

Two parts, both on two cores of this machine:

- rings: two processes over real shm ring pairs (the test-only extension's ``shm_hops``, so
  this part needs a build with APPLIANCE_BUILD_TESTS=ON). Per way of waiting (spin, yield,
  doorbell, backoff = the data exchange's, drive = a driving caller's control waits), the
  one-way latency of a message (64 B, 4 KiB; each carries its send time, one clock for both
  processes), and the time of a 4 KiB "operation" made of one data exchange (OpenMPI vader's
  shape: ``op1``) or of our cached operation's three exchanges (READY 1 -> 0, PLAN 0 -> 1, then
  the data: ``op3``), with the time each side spent spinning, yielding and blocked on the
  doorbell per operation.
- engine: 2 ranks of our runtime (``appliance.launcher.launch``, bound as APPLIANCE_BIND says)
  running synchronous cached 4 KiB allreduces under each APPLIANCE_SPIN_US given: per operation
  its time, the control frames each rank sent and received, the calling thread's voluntary
  context switches (it blocked: on a doorbell, or on its handle) and involuntary ones (it was
  preempted: other work on its core), and, in a pass with profiling on, the engine's
  negotiation CPU time (engine turns less the plans they ran).

    APPLIANCE_BIND=core python benchmarks/hops.py --json results/hops.json
    python benchmarks/hops.py --parts rings --waits spin,backoff --iters 20000
    python benchmarks/hops.py --quick                        # seconds: 500 per row

Numbers are medians over operations (rings: of the slower side's); compare the rows of one run:
the machine is shared, and its load average at the start is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import benchlib as bl

WAITS = ("spin", "yield", "doorbell", "backoff", "drive")


def rings(waits, iters, cpus, spin_us) -> list:
    from appliance.runtime import _core_testing as ct

    rows = []
    for wait in waits:
        for nbytes in (64, 4096):
            r = ct.shm_hops("pingpong", wait, nbytes, iters, cpus=cpus, spin_us=spin_us)
            rows.append({"part": "rings", "mode": "pingpong", "wait": wait, "bytes": nbytes,
                         "a_to_b_us": statistics.median(r["b"]["samples_ns"]) / 1e3,
                         "b_to_a_us": statistics.median(r["a"]["samples_ns"]) / 1e3,
                         "phases_a": per_op(r["a"]["phases"], iters), "phases_b": per_op(r["b"]["phases"], iters)})
        for mode in ("op1", "op3"):
            r = ct.shm_hops(mode, wait, 4096, iters, cpus=cpus, spin_us=spin_us)
            ma, mb = (statistics.median(r[s]["samples_ns"]) / 1e3 for s in ("a", "b"))
            rows.append({"part": "rings", "mode": mode, "wait": wait, "bytes": 4096, "op_us": max(ma, mb),
                         "phases_a": per_op(r["a"]["phases"], iters), "phases_b": per_op(r["b"]["phases"], iters)})
    return rows


def per_op(p: dict, iters: int) -> dict:
    """A side's waits per iteration: counts (means), and the medians over iterations of the
    microseconds spent spinning, yielding, blocked on the doorbell."""
    return {"waits": p["waits"] / iters, "yields": p["yields"] / iters, "blocks": p["blocks"] / iters,
            "spin_us": p["med_spin"] / 1e3, "yield_us": p["med_yield"] / 1e3, "block_us": p["med_block"] / 1e3,
            "period_us": p["loop_ns"] / iters / 1e3}


def worker_engine(iters, out, gloo=False):
    import resource

    import time

    import numpy as np

    import appliance.runtime as rt
    from appliance.runtime import engine

    rt.init()
    if gloo:  # as benchmarks/collectives.py's ranks: torch loaded, a gloo group beside ours
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rt.rank(), world_size=rt.size())
    core = engine.current().core
    a = np.ones(1024, np.float32)
    b = np.empty_like(a)
    for _ in range(200):
        rt.allreduce(a, op=rt.Sum, name="hops.4k", out=b)
    rt.barrier()

    def thread_csw():
        u = resource.getrusage(resource.RUSAGE_THREAD)
        return u.ru_nvcsw, u.ru_nivcsw

    s0, c0 = dict(core.stats()), thread_csw()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        rt.allreduce(a, op=rt.Sum, name="hops.4k", out=b)
        times.append(time.perf_counter() - t0)
    s1, c1 = dict(core.stats()), thread_csw()
    # As benchmarks/collectives.py samples: runs of 20 after a barrier and one untimed call.
    short, c2 = [], thread_csw()
    for _ in range(max(1, iters // 20)):
        rt.barrier()
        rt.allreduce(a, op=rt.Sum, name="hops.4k", out=b)
        for _ in range(20):
            t0 = time.perf_counter()
            rt.allreduce(a, op=rt.Sum, name="hops.4k", out=b)
            short.append(time.perf_counter() - t0)
    c3 = thread_csw()
    rt.barrier()
    core.set_profiling(True)
    p0 = dict(core.stats())
    for _ in range(iters):
        rt.allreduce(a, op=rt.Sum, name="hops.4k", out=b)
    p1 = dict(core.stats())
    core.set_profiling(False)
    q = statistics.quantiles(times, n=10)
    row = {"rank": rt.rank(), "op_us": statistics.median(times) * 1e6, "p10_us": q[0] * 1e6, "p90_us": q[-1] * 1e6,
           "short_us": statistics.median(short) * 1e6, "short_vol_csw": (c3[0] - c2[0]) / len(short),
           "ctrl_in": (s1["ctrl_in"] - s0["ctrl_in"]) / iters, "ctrl_out": (s1["ctrl_out"] - s0["ctrl_out"]) / iters,
           "driven_plans": (s1["driven_plans"] - s0["driven_plans"]) / iters,
           "vol_csw": (c1[0] - c0[0]) / iters, "invol_csw": (c1[1] - c0[1]) / iters,
           "negotiation_us": (p1["negotiation_ns"] - p0["negotiation_ns"]) / iters / 1e3,
           "negotiation_turns": (p1["negotiation_turns"] - p0["negotiation_turns"]) / iters}
    with open(f"{out}.{rt.rank()}", "w") as f:  # the parent reads each rank's row
        json.dump(row, f)
    if gloo:
        dist.destroy_process_group()
    rt.shutdown()


def engine_part(spins, iters, gloo=False) -> list:
    from appliance.launcher import launch

    rows = []
    for spin in spins:
        out = bl.result_path(f"engine-{spin}")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--iters", str(iters), "--out", out] + (["--gloo"] if gloo else [])
        res = launch(cmd, np=2, timeout=600, env={"APPLIANCE_SPIN_US": str(spin)})
        if res.returncode != 0:
            raise SystemExit(f"engine ranks failed (rc={res.returncode}):\n{bl.ranks_output(res)}")
        ranks = []
        for r in range(2):
            with open(f"{out}.{r}") as f:
                ranks.append(json.load(f))
        rows.append({"part": "engine", "spin_us": spin, "gloo": gloo, "ranks": ranks})
    return rows


def print_rows(rows, file=sys.stdout):
    def ph(p):
        return (f"{p['spin_us']:6.2f} {p['yield_us']:6.2f} {p['block_us']:6.2f} "
                f"({p['yields']:.1f} yields, {p['blocks']:.2f} blocks)")

    ring = [r for r in rows if r["part"] == "rings"]
    if ring:
        print("\nrings: one-way latency of a message (us, median), A = cpu of rank 0, B = rank 1's", file=file)
        print(f"{'wait':>9} {'bytes':>6} {'A->B':>7} {'B->A':>7} | B's wait per message (medians): spin yield block us",
              file=file)
        for r in ring:
            if r["mode"] == "pingpong":
                print(f"{r['wait']:>9} {r['bytes']:>6} {r['a_to_b_us']:7.2f} {r['b_to_a_us']:7.2f} | {ph(r['phases_b'])}",
                      file=file)
        print("\nrings: a 4 KiB operation (us, median of the slower side): op1 = one data exchange (vader's shape), "
              "op3 = READY, PLAN, data (ours)", file=file)
        print(f"{'wait':>9} {'op1':>7} {'op3':>7} {'op3/op1':>7} | op3 per op (medians), rank 0: spin yield block us | "
              f"rank 1: spin yield block us", file=file)
        by = {(r["wait"], r["mode"]): r for r in ring}
        for w in dict.fromkeys(r["wait"] for r in ring):
            o1, o3 = by.get((w, "op1")), by.get((w, "op3"))
            if o1 and o3:
                print(f"{w:>9} {o1['op_us']:7.2f} {o3['op_us']:7.2f} {o3['op_us'] / o1['op_us']:7.2f} | "
                      f"{ph(o3['phases_a'])} | {ph(o3['phases_b'])}", file=file)
    eng = [r for r in rows if r["part"] == "engine"]
    if eng:
        gl = " (torch and a gloo group loaded in each rank)" if eng[0].get("gloo") else ""
        print(f"\nengine: synchronous cached 4 KiB allreduce at 2 ranks, per operation{gl}", file=file)
        print(f"{'SPIN_US':>7} {'rank':>4} {'us':>7} {'p10':>6} {'p90':>6} {'ctrl in/out':>11} {'driven':>6} "
              f"{'vol csw':>7} {'invol':>6} {'negot. us':>9} {'turns':>6} | runs of 20: {'us':>6} {'vol csw':>7}",
              file=file)
        for r in eng:
            for k in r["ranks"]:
                print(f"{r['spin_us']:>7} {k['rank']:>4} {k['op_us']:7.2f} {k['p10_us']:6.2f} {k['p90_us']:6.2f} "
                      f"{k['ctrl_in']:5.2f}/{k['ctrl_out']:<5.2f} {k['driven_plans']:6.2f} {k['vol_csw']:7.3f} "
                      f"{k['invol_csw']:6.3f} {k['negotiation_us']:9.2f} {k['negotiation_turns']:6.2f} | "
                      f"{'':>11} {k['short_us']:6.2f} {k['short_vol_csw']:7.3f}", file=file)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="rings,engine", help="comma list of rings, engine")
    p.add_argument("--waits", default=",".join(WAITS), help="rings: comma list of " + ", ".join(WAITS))
    p.add_argument("--iters", type=int, default=None, help="operations (messages) measured per row (default 20000)")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke: 500 per row, waits spin and backoff")
    p.add_argument("--cpus", default="0,1", help="rings: the two cpus (default 0,1)")
    p.add_argument("--spin-us", default="100", help="comma list of APPLIANCE_SPIN_US values (engine; the rings' "
                                                    "drive wait uses the first)")
    p.add_argument("--gloo", action="store_true", help="engine: also load torch and open a gloo group in each "
                                                       "rank, as benchmarks/collectives.py's ranks do")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.iters = a.iters or (500 if a.quick else 20000)
    if a.quick and a.waits == ",".join(WAITS):
        a.waits = "spin,backoff"
    if a.worker:
        worker_engine(a.iters, a.out, a.gloo)
        return 0
    parts = [x for x in a.parts.split(",") if x]
    waits = [w for w in a.waits.split(",") if w]
    bad = [x for x in parts if x not in ("rings", "engine")] + [w for w in waits if w not in WAITS]
    if bad:
        p.error(f"unknown part or wait: {', '.join(bad)}")
    spins = [int(s) for s in a.spin_us.split(",") if s]
    cpus = [int(c) for c in a.cpus.split(",")]
    print(bl.machine_line())
    rows = []
    if "rings" in parts:
        rows += rings(waits, a.iters, cpus, spins[0])
    if "engine" in parts:
        rows += engine_part(spins, a.iters, a.gloo)
    print_rows(rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": bl.machine_line(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
