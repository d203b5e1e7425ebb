"""Collective latency and bandwidth: our runtime beside gloo, OpenMPI (shared memory and tcp) and memcpy.

One invocation runs every backend, one after another, on the same machine:
- ours and gloo: N ranks started with ``appliance.launcher.launch``; every rank initialises our
  runtime and a torch.distributed gloo group (the launcher hands out MASTER_ADDR/PORT) and, for
  each op and size, times both, interleaved, so they see the same machine state;
- OpenMPI shared memory (``--mca btl self,vader``) and OpenMPI tcp (``--mca btl self,tcp`` on
  loopback): ``mpirun`` + ``mpi4py`` (pip ``.[bench]``); when either is missing one line says so
  and the rest runs;
- ours-tcp: our runtime again with shared memory off (APPLIANCE_SHM=0, every pair on TCP): what
  ranks on different hosts get, to compare with OpenMPI tcp (ratio column tcp/ours-tcp);
- memcpy: one core copying the same bytes in this process (a reference: algbw only).

    python benchmarks/collectives.py                         # 2 ranks, 4K..256M, all ops
    python benchmarks/collectives.py --quick                 # seconds: 4K and 64K, few iterations
    python benchmarks/collectives.py --ops allreduce --sizes 4K,64M --json out.json --plot busbw.png

Each backend's samples are taken in three passes over the whole sweep (a burst of other work
spoils one pass, not a size); times are medians over a rank's samples, then the slowest rank's (a
collective is as slow as its last rank). Sizes and bandwidths follow nccl-tests: size S is the per-rank buffer for
allreduce and broadcast, the gathered output for allgather, each rank's send buffer for alltoall;
algbw = S / time; busbw = algbw x 2(P-1)/P (allreduce), x (P-1)/P (allgather, alltoall), x 1
(broadcast). Broadcast runs in place in every backend; allgather and alltoall return a new
output from ours (Horovod's API), into a buffer reused across calls for gloo and OpenMPI.
Ratios are baseline time / our time: above 1 means we are faster. Sum over float32,
or ``--dtype float16`` (mixed-precision gradients, ``hvd.Compression.fp16``): OpenMPI has no
float16 reduction, so its legs are left out then, with a line saying so.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import benchlib as bl

OPS = ("allreduce", "allgather", "broadcast", "alltoall")
BACKENDS = ("ours", "ours-tcp", "gloo", "mpi-shm", "mpi-tcp", "memcpy")
BASELINES = ("gloo", "mpi-shm", "mpi-tcp")
DEFAULT_SIZES = "4K-256M"
DTYPES = {"float32": 4, "float16": 2}  # element sizes
BUS_FACTOR = {"allreduce": lambda p: 2 * (p - 1) / p, "allgather": lambda p: (p - 1) / p,
              "broadcast": lambda p: 1.0, "alltoall": lambda p: (p - 1) / p}


def counts(op: str, nbytes: int, p: int, esz: int = 4) -> tuple:
    """(elements in each rank's input, nccl-tests size in bytes) for ``op`` at ``nbytes``, elements of ``esz`` bytes."""
    n = max(1, nbytes // esz)
    if op == "allgather":
        per = max(1, n // p)
        return per, per * p * esz
    if op == "alltoall":
        n = max(p, n - n % p)
    return n, n * esz


def ours_call(op, rt, np_, n, p, name, dtype="float32"):
    a = np_.ones(n, getattr(np_, dtype))
    if op == "allreduce":
        b = np_.empty_like(a)
        return lambda: rt.allreduce(a, op=rt.Sum, name=name, out=b)
    if op == "allgather":
        return lambda: rt.allgather(a, name=name)
    if op == "broadcast":
        return lambda: rt.broadcast(a, 0, name=name, out=a)  # in place, as gloo's and MPI's
    return lambda: rt.alltoall(a, name=name)


def gloo_call(op, torch, dist, n, p, dtype="float32"):
    t = torch.ones(n, dtype=getattr(torch, dtype))
    if op == "allreduce":
        return lambda: dist.all_reduce(t)
    if op == "allgather":
        out = torch.empty(n * p, dtype=t.dtype)
        return lambda: dist.all_gather_into_tensor(out, t)
    if op == "broadcast":
        return lambda: dist.broadcast(t, 0)
    out = torch.empty_like(t)
    return lambda: dist.all_to_all_single(out, t)


def mpi_call(op, MPI, comm, np_, n, p):
    a = np_.ones(n, np_.float32)
    if op == "allreduce":
        b = np_.empty_like(a)
        return lambda: comm.Allreduce(a, b, op=MPI.SUM)
    if op == "allgather":
        out = np_.empty(n * p, np_.float32)
        return lambda: comm.Allgather(a, out)
    if op == "broadcast":
        return lambda: comm.Bcast(a, root=0)
    out = np_.empty_like(a)
    return lambda: comm.Alltoall(a, out)


def worker_ours_and_gloo(ops, sizes, iters, out, tcp_only=False, dtype="float32"):
    import numpy as np
    import torch
    import torch.distributed as dist

    import appliance.runtime as rt

    rt.init()
    torch.set_num_threads(1)
    if not tcp_only:
        dist.init_process_group("gloo", rank=rt.rank(), world_size=rt.size())
    p = rt.size()
    cells = [(op, *counts(op, nbytes, p, DTYPES[dtype])) for op in ops for nbytes in sizes]

    def make(cell):
        op, n, size = cell
        ours = ours_call(op, rt, np, n, p, f"bench.{op}.{size}", dtype)
        if tcp_only:
            return {"ours-tcp": ours}
        return {"ours": ours, "gloo": gloo_call(op, torch, dist, n, p, dtype)}

    samples = bl.sweep(cells, make, rt.barrier, lambda cell: bl.iters_for(cell[2], iters))
    keys = sorted(samples)
    # every rank's median; the slowest rank's counts (a collective is as slow as its last rank)
    med = rt.allreduce(np.array([bl.median(samples[k]) for k in keys], np.float64), op=rt.Max, name="bench.median")
    rows = [{"op": op, "bytes": size, "backend": b, "time_s": float(t), "iters": len(samples[(op, n, size), b])}
            for ((op, n, size), b), t in zip(keys, med)]
    if rt.rank() == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    if not tcp_only:
        dist.destroy_process_group()
    rt.shutdown()


def worker_mpi(ops, sizes, iters, out, backend):
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    p = comm.size
    cells = [(op, *counts(op, nbytes, p)) for op in ops for nbytes in sizes]
    samples = bl.sweep(cells, lambda c: {backend: mpi_call(c[0], MPI, comm, np, c[1], p)}, comm.Barrier,
                       lambda cell: bl.iters_for(cell[2], iters))
    keys = sorted(samples)
    med = np.array([bl.median(samples[k]) for k in keys], np.float64)
    comm.Allreduce(MPI.IN_PLACE, med, op=MPI.MAX)
    rows = [{"op": op, "bytes": size, "backend": b, "time_s": float(t), "iters": len(samples[(op, n, size), b])}
            for ((op, n, size), b), t in zip(keys, med)]
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)


def memcpy_rows(ops, sizes, iters, p, esz=4) -> list:
    """One core copying S bytes (numpy copyto: a single-threaded memcpy); algbw only."""
    import numpy as np

    rows = []
    for size in sorted({counts(op, s, p, esz)[1] for op in ops for s in sizes}):
        src = np.ones(size, np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        k = bl.iters_for(size, iters)
        t = bl.median(bl.time_op(lambda: np.copyto(dst, src), k))
        rows.append({"op": "memcpy", "bytes": size, "backend": "memcpy", "time_s": t, "iters": k})
    return rows


def add_bandwidth(rows, p):
    for r in rows:
        r["algbw_GBps"] = r["bytes"] / r["time_s"] / 1e9
        factor = 1.0 if r["backend"] == "memcpy" else BUS_FACTOR[r["op"]](p)
        r["busbw_GBps"] = r["algbw_GBps"] * factor


def print_tables(rows, ops, p, backends, file=sys.stdout, dtype="float32"):
    by = {(r["op"], r["bytes"], r["backend"]): r for r in rows}
    memcpy = {r["bytes"]: r for r in rows if r["backend"] == "memcpy"}
    colls = [b for b in BACKENDS if b != "memcpy" and b in backends]
    base = [b for b in BASELINES if b in colls and "ours" in colls]
    tcp_pair = "mpi-tcp" in colls and "ours-tcp" in colls
    for op in ops:
        sizes = sorted({r["bytes"] for r in rows if r["op"] == op})
        print(f"\n{op}, {dtype}, {p} ranks on one host: median time of the slowest rank (us) | "
              f"busbw GB/s (nccl-tests) | time ratio baseline/ours (>1: ours faster)", file=file)
        head = f"{'size':>6} " + " ".join(f"{b:>8}" for b in colls) + " | " + " ".join(f"{b:>7}" for b in colls)
        if "memcpy" in backends:
            head += f" {'memcpy':>7}"
        head += " | " + " ".join(f"{b.replace('mpi-', '') + '/ours':>9}" for b in base)
        if tcp_pair:
            head += f" {'tcp/ours-tcp':>12}"
        print(head, file=file)
        for s in sizes:
            cell = {b: by.get((op, s, b)) for b in colls}
            line = f"{bl.human(s):>6} " + " ".join(f"{bl.fmt_us(c['time_s'] if c else None):>8}" for c in cell.values())
            line += " | " + " ".join(f"{c['busbw_GBps']:>7.2f}" if c else f"{'-':>7}" for c in cell.values())
            if "memcpy" in backends:
                m = memcpy.get(s)
                line += f" {m['algbw_GBps']:>7.2f}" if m else f" {'-':>7}"
            ours = cell.get("ours")
            line += " | " + " ".join(
                f"{bl.fmt_ratio(cell[b]['time_s'] if cell[b] else None, ours['time_s'] if ours else None):>9}"
                for b in base)
            if tcp_pair:
                a, b = cell["mpi-tcp"], cell["ours-tcp"]
                line += f" {bl.fmt_ratio(a['time_s'] if a else None, b['time_s'] if b else None):>12}"
            print(line, file=file)
    if "memcpy" in backends:
        print("memcpy: one core copying S bytes in one process (algbw = S / time), a reference for the "
              "busbw columns", file=file)


def run_ours_and_gloo(np_, ops, sizes, iters, tcp_only=False, dtype="float32") -> list:
    from appliance.launcher import launch

    worker = "ours-tcp" if tcp_only else "ours"
    out = bl.result_path(worker)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", worker, "--ops", ",".join(ops),
           "--sizes", ",".join(map(str, sizes)), "--iters", str(iters), "--dtype", dtype, "--out", out]
    res = launch(cmd, np=np_, timeout=3600, env={"APPLIANCE_SHM": "0"} if tcp_only else None)
    if res.returncode != 0:
        raise SystemExit(f"ours/gloo ranks failed (rc={res.returncode}):\n{bl.ranks_output(res)}")
    with open(out) as f:
        return json.load(f)


def run_mpi_leg(np_, transport, ops, sizes, iters) -> list:
    out = bl.result_path(f"mpi-{transport}")
    argv = [sys.executable, os.path.abspath(__file__), "--worker", f"mpi-{transport}", "--ops", ",".join(ops),
            "--sizes", ",".join(map(str, sizes)), "--iters", str(iters), "--out", out]
    if not bl.run_mpi(np_, transport, argv, timeout=3600):
        return []
    with open(out) as f:
        return json.load(f)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--sizes", default=None,
                   help=f"comma list (4K,1M) or a range of powers of 4 (default {DEFAULT_SIZES})")
    p.add_argument("--ops", default=",".join(OPS), help="comma list of " + ", ".join(OPS))
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma list of " + ", ".join(BACKENDS))
    p.add_argument("--iters", type=int, default=None, help="samples per size up to 1 MiB, fewer above (default 60)")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke: 4K and 64K, 10 samples")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--plot", metavar="PNG", help="also plot busbw against size (benchmarks/plot.py)")
    p.add_argument("--no-mpi", action="store_true", help="leave out both OpenMPI backends")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="element type (default float32; float16 leaves OpenMPI out: it has no float16 reduction)")
    p.add_argument("--worker", choices=["ours", "ours-tcp", "mpi-shm", "mpi-tcp"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    sizes = bl.parse_sizes(a.sizes or ("4K,64K" if a.quick else DEFAULT_SIZES))
    iters = a.iters or (10 if a.quick else 60)
    ops = [o for o in a.ops.split(",") if o]
    backends = [b for b in a.backends.split(",") if b]
    bad = [o for o in ops if o not in OPS] + [b for b in backends if b not in BACKENDS]
    if bad:
        p.error(f"unknown op or backend: {', '.join(bad)}")
    if a.worker in ("ours", "ours-tcp"):
        worker_ours_and_gloo(ops, sizes, iters, a.out, tcp_only=a.worker == "ours-tcp", dtype=a.dtype)
        return 0
    if a.worker:
        worker_mpi(ops, sizes, iters, a.out, a.worker)
        return 0
    if a.no_mpi:
        backends = [b for b in backends if not b.startswith("mpi-")]

    machine = bl.machine_line()
    rows, skipped = [], {}
    if "ours" in backends or "gloo" in backends:
        rows += [r for r in run_ours_and_gloo(a.np, ops, sizes, iters, dtype=a.dtype) if r["backend"] in backends]
    if "ours-tcp" in backends:
        rows += run_ours_and_gloo(a.np, ops, sizes, iters, tcp_only=True, dtype=a.dtype)
    mpi_legs = [b for b in backends if b.startswith("mpi-")]
    why = bl.mpi_missing() if mpi_legs else None
    if mpi_legs and a.dtype != "float32":
        why = f"OpenMPI legs left out: OpenMPI has no {a.dtype} reduction"
    if why:
        print(why, file=sys.stderr)
        skipped.update({b: why for b in mpi_legs})
    else:
        for b in mpi_legs:
            got = run_mpi_leg(a.np, b[4:], ops, sizes, iters)
            rows += got
            if not got:
                skipped[b] = "mpirun failed"
    if "memcpy" in backends:
        rows += memcpy_rows(ops, sizes, iters, a.np, DTYPES[a.dtype])
    add_bandwidth(rows, a.np)
    present = [b for b in backends if b not in skipped]
    print(f"{a.np} ranks; host {platform.node()}: {machine}; backends: {', '.join(present)}")
    print_tables(rows, ops, a.np, present, dtype=a.dtype)
    result = {"np": a.np, "cpus": os.cpu_count(), "machine": machine, "dtype": a.dtype, "ops": ops, "backends": present,
              "skipped": skipped, "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    if a.plot:
        import plot

        plot.plot(result, a.plot)
        print(f"plot: {a.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
