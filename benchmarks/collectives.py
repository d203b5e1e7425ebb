"""Allreduce latency and bandwidth: our runtime beside torch.distributed (gloo) and OpenMPI.

One run starts N ranks with ``appliance.launcher.launch``; every rank initialises both our
runtime and a gloo process group (the launcher hands out MASTER_ADDR/MASTER_PORT), and for
each size times both, interleaved, so they see the same machine state. When ``mpirun`` and
``mpi4py`` are installed, a second phase times ``MPI.Allreduce`` under OpenMPI (shared memory
on one host). It prints medians and the ratios baseline/ours (above 1 = we are faster).

    python benchmarks/collectives.py                     # 2 ranks, 4 KiB .. 64 MiB
    python benchmarks/collectives.py --np 3 --sizes 4K,1M --iters 50 --json out.json

busbw follows the nccl-tests convention: bytes * 2 (P-1) / P / time.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B")
    return int(float(s[:-1]) * UNITS[s[-1]]) if s[-1] in UNITS else int(s)


def human(n: int) -> str:
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m}{unit}"
    return str(n)


def iters_for(nbytes: int, base: int) -> int:
    return max(5, min(base, int(base * (1 << 20) / max(nbytes, 1))))


def time_op(fn, iters: int) -> list:
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def worker_ours_and_gloo(sizes, iters, out):
    import numpy as np
    import torch
    import torch.distributed as dist

    import appliance.runtime as rt

    rt.init()
    dist.init_process_group("gloo", rank=rt.rank(), world_size=rt.size())
    torch.set_num_threads(1)
    results = []
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        a = np.ones(n, np.float32)
        t = torch.ones(n, dtype=torch.float32)
        k = iters_for(nbytes, iters)
        for _ in range(3):  # warm-up: connections, caches, page faults
            rt.allreduce(a, op=rt.Sum, name="bench", out=a)
            dist.all_reduce(t)
        ours, gloo = [], []
        for _ in range(3):  # interleave so both see the same machine state
            ours += time_op(lambda: rt.allreduce(a, op=rt.Sum, name="bench", out=a), k // 3 + 1)
            gloo += time_op(lambda: dist.all_reduce(t), k // 3 + 1)
        # every rank's median; report the slowest rank's (a collective is as slow as its last rank)
        med = np.array([statistics.median(ours), statistics.median(gloo)], np.float64)
        med = rt.allreduce(med, op=rt.Max, name="bench.med")
        results.append({"bytes": n * 4, "ours": med[0], "gloo": med[1], "iters": len(ours)})
    if rt.rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()
    rt.shutdown()


def worker_mpi(sizes, iters, out):
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    results = []
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        a = np.ones(n, np.float32)
        b = np.empty_like(a)
        k = iters_for(nbytes, iters)
        for _ in range(3):
            comm.Allreduce(a, b, op=MPI.SUM)
        samples = time_op(lambda: comm.Allreduce(a, b, op=MPI.SUM), k)
        med = comm.allreduce(statistics.median(samples), op=MPI.MAX)
        results.append({"bytes": n * 4, "mpi": med})
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)


def result_path(tag: str) -> str:
    """A fresh path in a private temporary directory for a worker's JSON result."""
    return os.path.join(tempfile.mkdtemp(prefix="appliance-bench-"), f"{tag}.json")


def run_mpi(np_, sizes, iters) -> dict:
    if not shutil.which("mpirun"):
        print("(OpenMPI: mpirun not found; skipped)", file=sys.stderr)
        return {}
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        print("(OpenMPI: mpi4py not installed; skipped)", file=sys.stderr)
        return {}
    out = result_path("mpi")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), "--bind-to", "none",
           "--mca", "btl", "self,vader", sys.executable, __file__, "--worker", "mpi",
           "--sizes", ",".join(map(str, sizes)), "--iters", str(iters), "--out", out]
    subprocess.run(cmd, check=True, timeout=1800)
    with open(out) as f:
        return {r["bytes"]: r["mpi"] for r in json.load(f)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    p.add_argument("--iters", type=int, default=60, help="samples per size at 1 MiB (scaled by size)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--no-mpi", action="store_true")
    p.add_argument("--worker", choices=["ours", "mpi"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    if a.worker == "ours":
        worker_ours_and_gloo(sizes, a.iters, a.out)
        return 0
    if a.worker == "mpi":
        worker_mpi(sizes, a.iters, a.out)
        return 0

    from appliance.launcher import launch

    out = result_path("ours")
    res = launch([sys.executable, __file__, "--worker", "ours", "--sizes", ",".join(map(str, sizes)),
                  "--iters", str(a.iters), "--out", out], np=a.np, timeout=1800)
    if res.returncode != 0:
        print(res.output()[-4000:], file=sys.stderr)
        return res.returncode
    with open(out) as f:
        rows = json.load(f)
    mpi = {} if a.no_mpi else run_mpi(a.np, sizes, a.iters)
    P = a.np
    print(f"allreduce float32, {P} ranks on one host (median of the slowest rank, microseconds)")
    print(f"{'size':>6} {'ours':>10} {'gloo':>10} {'mpi':>10} {'gloo/ours':>10} {'mpi/ours':>9} {'busbw GB/s':>11}")
    for r in rows:
        m = mpi.get(r["bytes"])
        r["mpi"] = m
        busbw = r["bytes"] * 2 * (P - 1) / P / r["ours"] / 1e9
        print(f"{human(r['bytes']):>6} {r['ours'] * 1e6:>10.1f} {r['gloo'] * 1e6:>10.1f} "
              f"{(m * 1e6 if m else float('nan')):>10.1f} {r['gloo'] / r['ours']:>10.2f} "
              f"{(m / r['ours'] if m else float('nan')):>9.2f} {busbw:>11.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"np": P, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
