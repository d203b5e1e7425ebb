"""Many small allreduces at once (what fusion is for): our runtime beside gloo and OpenMPI shared memory.

Each case enqueues a list of float32 tensors as asynchronous allreduces (Sum), last tensor first
(the order backward produces gradients), then waits for all of them: what Horovod's
DistributedOptimizer does with a model's gradients (one ``allreduce_async_`` per parameter from
its hook, all waited in ``step``). Cases:
- ``100 x 4K``: 100 tensors of 4 KiB; ``1 x 400K``: one tensor of the same 400 KiB;
- ``resnet18``: ResNet-18's 62 parameter shapes (11.7 M floats; bench_models.resnet18);
- ``transformer``: a small transformer LM's parameter shapes (d=256, 4 layers; bench_models.TransformerLM).
Backends: ours (``appliance.torch.allreduce_async_`` per tensor + ``synchronize``, as
DistributedOptimizer by default), ours-grouped (one ``grouped_allreduce_async_`` of all the tensors,
as DistributedOptimizer with ``groups``), ours-opt (``DistributedOptimizer`` itself: its gradient
hooks, last parameter first, then its ``synchronize``), ours-fused (one allreduce of one tensor of
the case's bytes: the floor the others are compared with), torch.distributed gloo
(``all_reduce(async_op=True)`` + ``wait``), OpenMPI shared memory (``Iallreduce`` + ``Waitall``,
mpirun + mpi4py; skipped with one line when missing). Ranks of ours and gloo are started by
``appliance.launcher.launch`` and time them one after another for each case, in three passes
over the cases (a burst of other work spoils a pass, not a case).

    python benchmarks/fusion.py [--np 2] [--quick] [--json out.json]
    python benchmarks/fusion.py --floor     # the Python path's per-call floor at one rank

Prints the median time of the slowest rank per case, ratios baseline/ours (>1: ours faster), the
fusion ratio (100 x 4K time / 1 x 400K time; 1 would mean 100 small ones cost one fused one), and
per case each of ours' ways over one fused allreduce of the same bytes.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import benchlib as bl

CASES = ("100x4K", "1x400K", "resnet18", "transformer")
BACKENDS = ("ours", "gloo", "mpi-shm")


@functools.lru_cache(maxsize=None)
def case_shapes(case: str) -> list:
    if case == "100x4K":
        return [(1024,)] * 100
    if case == "1x400K":
        return [(102400,)]
    import bench_models as bm

    model = bm.resnet18() if case == "resnet18" else bm.TransformerLM(vocab=2048, d=256, layers=4, heads=4)
    return bm.shapes(model)


def case_iters(shapes, base: int) -> int:
    total = sum(4 * _numel(s) for s in shapes)
    return bl.iters_for(total, base)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def ours_and_gloo_calls(case, hvd, torch, dist) -> dict:
    shapes = case_shapes(case)
    ours_t = [torch.ones(s) for s in shapes]
    gloo_t = [torch.ones(s) for s in shapes]
    names = [f"fusion.{case}.{i}" for i in range(len(shapes))]

    def ours():
        handles = [hvd.allreduce_async_(ours_t[i], name=names[i], op=hvd.Sum) for i in reversed(range(len(shapes)))]
        for h in handles:
            hvd.synchronize(h)

    def grouped():
        hvd.synchronize(hvd.grouped_allreduce_async_(ours_t[::-1], name=f"fusion.{case}.grouped", op=hvd.Sum))

    # DistributedOptimizer (op Sum, as every case here): its per-parameter hooks fired last
    # parameter first, as backward fires them once a gradient is accumulated (called directly:
    # no backward pass, whose arithmetic is not what this measures), then its synchronize()
    params = [torch.nn.Parameter(torch.ones(s)) for s in shapes]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), op=hvd.Sum,
                                   named_parameters=[(f"fusion.{case}.opt.{i}", p) for i, p in enumerate(params)])
    hooks = [h for p in reversed(params) for h in p._post_accumulate_grad_hooks.values()]
    flat = torch.ones(sum(_numel(s) for s in shapes))

    def optimizer():
        for h, p in zip(hooks, reversed(params)):
            h(p)
        opt.synchronize()

    def fused():  # one allreduce of the same bytes: what the other backends are measured against
        hvd.synchronize(hvd.allreduce_async_(flat, name=f"fusion.{case}.fused", op=hvd.Sum))

    def gloo():
        works = [dist.all_reduce(gloo_t[i], async_op=True) for i in reversed(range(len(shapes)))]
        for w in works:
            w.wait()

    calls = {"ours": ours, "ours-grouped": grouped, "ours-opt": optimizer, "ours-fused": fused, "gloo": gloo}
    if hvd.size() == 1:  # DistributedOptimizer starts no allreduce at one rank
        del calls["ours-opt"]
    return calls


def mpi_call(case, MPI, comm, np):
    bufs = [np.ones(_numel(s), np.float32) for s in case_shapes(case)]

    def run():
        reqs = [comm.Iallreduce(MPI.IN_PLACE, bufs[i], op=MPI.SUM) for i in reversed(range(len(bufs)))]
        MPI.Request.Waitall(reqs)

    return run


def rows_of(samples, medians) -> list:
    rows = []
    for (case, backend), t in zip(sorted(samples), medians):
        shapes = case_shapes(case)
        rows.append({"case": case, "tensors": len(shapes), "bytes": sum(4 * _numel(s) for s in shapes),
                     "backend": backend, "time_s": float(t), "iters": len(samples[case, backend])})
    return rows


def worker_ours_and_gloo(cases, iters, out):
    import torch
    import torch.distributed as dist

    import appliance.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())
    samples = bl.sweep(cases, lambda c: ours_and_gloo_calls(c, hvd, torch, dist), hvd.barrier,
                       lambda c: case_iters(case_shapes(c), iters))
    # every rank's median; the slowest rank's counts
    med = torch.tensor([bl.median(samples[k]) for k in sorted(samples)], dtype=torch.float64)
    med = hvd.allreduce(med, op=hvd.Max, name="fusion.median")
    if hvd.rank() == 0:
        with open(out, "w") as f:
            json.dump(rows_of(samples, med.tolist()), f)
    dist.destroy_process_group()
    hvd.shutdown()


def worker_mpi(cases, iters, out):
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    samples = bl.sweep(cases, lambda c: {"mpi-shm": mpi_call(c, MPI, comm, np)}, comm.Barrier,
                       lambda c: case_iters(case_shapes(c), iters))
    med = np.array([bl.median(samples[k]) for k in sorted(samples)], np.float64)
    comm.Allreduce(MPI.IN_PLACE, med, op=MPI.MAX)
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump(rows_of(samples, med.tolist()), f)


def floor(reps: int) -> None:
    """The Python path's floor at one rank, in this process (no launcher): per call of 100 x 4 KiB
    in-place allreduces, as the core's own calls, as ``allreduce_async_`` + ``synchronize``, as
    ``allreduce_async_`` + one ``synchronize_all``, and through DistributedOptimizer (hooks +
    ``synchronize``; registered by hand, as it registers none at one rank). Medians of 7 runs."""
    import statistics
    import time

    import torch

    import appliance.torch as hvd
    from appliance.runtime import engine

    hvd.init()
    torch.set_num_threads(1)
    n = 100
    ts = [torch.ones(1024) for _ in range(n)]
    names = [f"floor.{i}" for i in range(n)]
    core, req = engine.current().core, engine.request(engine.Kind.ALLREDUCE, hvd.Sum)
    descs = [(t.data_ptr(), engine.DType.FLOAT32, t.shape, t.data_ptr()) for t in ts]
    params = [torch.nn.Parameter(torch.ones(1024)) for _ in range(n)]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), op=hvd.Sum,
                                   named_parameters=[(f"floor.opt.{i}", p) for i, p in enumerate(params)])
    opt._register_hooks()
    hooks = [(h, p) for p in reversed(params) for h in p._post_accumulate_grad_hooks.values()]
    sync_all = getattr(hvd.mpi_ops, "synchronize_all", None) or (lambda hs: [hvd.synchronize(h) for h in hs])

    def core_calls():
        core.wait([core.submit(req, names[i], descs[i]) for i in range(n)])

    def each():
        for h in [hvd.allreduce_async_(ts[i], name=names[i], op=hvd.Sum) for i in range(n)]:
            hvd.synchronize(h)

    def batch():
        sync_all([hvd.allreduce_async_(ts[i], name=names[i], op=hvd.Sum) for i in range(n)])

    def optimizer():
        for h, p in hooks:
            h(p)
        opt.synchronize()

    print(f"one rank, 100 x 4 KiB in place, per call (us), median of 7 runs; {bl.machine_line()}")
    for fn in (core_calls, each, batch, optimizer):
        for _ in range(reps // 5 + 1):
            fn()
        runs = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            runs.append((time.perf_counter() - t) / reps / n)
        print(f"{fn.__name__:>11} {statistics.median(runs) * 1e6:6.2f}")
    hvd.shutdown()


def print_table(rows, cases, p, backends, file=sys.stdout):
    by = {(r["case"], r["backend"]): r for r in rows}
    base = [b for b in backends if not b.startswith("ours")]
    print(f"\nasync allreduce of many tensors, float32 Sum, {p} ranks on one host: enqueue all, then wait all; "
          f"median time of the slowest rank (us) | time ratio baseline/ours (>1: ours faster)", file=file)
    print(f"{'case':>12} {'tensors':>7} {'bytes':>7} " + " ".join(f"{b:>{max(9, len(b))}}" for b in backends) + " | "
          + " ".join(f"{b.replace('mpi-', '') + '/ours':>9}" for b in base), file=file)
    for case in cases:
        any_row = next((r for r in rows if r["case"] == case), None)
        if any_row is None:
            continue
        t = {b: by[(case, b)]["time_s"] if (case, b) in by else None for b in backends}
        print(f"{case:>12} {any_row['tensors']:>7} {bl.human(any_row['bytes']):>7} "
              + " ".join(f"{bl.fmt_us(t[b]):>{max(9, len(b))}}" for b in backends) + " | "
              + " ".join(f"{bl.fmt_ratio(t[b], t.get('ours')):>9}" for b in base), file=file)
    if "100x4K" in cases and "1x400K" in cases:
        parts = []
        for b in backends:
            if b == "ours-fused":  # one allreduce in both cases
                continue
            small, one = by.get(("100x4K", b)), by.get(("1x400K", b))
            if small and one:
                parts.append(f"{b} {small['time_s'] / one['time_s']:.1f}x")
        print("fusion ratio (100 x 4K time / 1 x 400K time): " + ", ".join(parts), file=file)
    for case in cases:
        fused = by.get((case, "ours-fused"))
        parts = [f"{b} {by[(case, b)]['time_s'] / fused['time_s']:.2f}x" for b in ("ours", "ours-grouped", "ours-opt")
                 if fused and (case, b) in by]
        if parts:
            print(f"{case}: time / one fused allreduce of the same bytes (ours-fused): " + ", ".join(parts), file=file)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--cases", default=",".join(CASES), help="comma list of " + ", ".join(CASES))
    p.add_argument("--iters", type=int, default=None, help="samples per case up to 1 MiB in all (default 60)")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke (5 samples per case)")
    p.add_argument("--no-mpi", action="store_true")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--floor", action="store_true", help="only the Python path's floor at one rank, in this process")
    p.add_argument("--worker", choices=["ours", "mpi-shm"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    cases = [c for c in a.cases.split(",") if c]
    if any(c not in CASES for c in cases):
        p.error(f"unknown case in {a.cases!r}; choose from {', '.join(CASES)}")
    iters = a.iters or (5 if a.quick else 60)
    if a.floor:
        floor(5 if a.quick else 50)
        return 0
    if a.worker == "ours":
        worker_ours_and_gloo(cases, iters, a.out)
        return 0
    if a.worker == "mpi-shm":
        worker_mpi(cases, iters, a.out)
        return 0

    from appliance.launcher import launch

    here = os.path.abspath(__file__)
    out = bl.result_path("fusion")
    machine = bl.machine_line()
    common = ["--cases", ",".join(cases), "--iters", str(iters)]
    res = launch([sys.executable, here, "--worker", "ours", *common, "--out", out], np=a.np, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"ours/gloo ranks failed (rc={res.returncode}):\n{bl.ranks_output(res)}")
    with open(out) as f:
        rows = json.load(f)
    backends = ["ours", "ours-grouped", "ours-opt", "ours-fused", "gloo"]
    why = "left out (--no-mpi)" if a.no_mpi else bl.mpi_missing()
    if why:
        print(why, file=sys.stderr)
    else:
        out = bl.result_path("fusion-mpi")
        if bl.run_mpi(a.np, "shm", [sys.executable, here, "--worker", "mpi-shm", *common, "--out", out], 3600):
            with open(out) as f:
                rows += json.load(f)
            backends.append("mpi-shm")
    print(f"{a.np} ranks; {machine}; backends: {', '.join(backends)}")
    print_table(rows, cases, a.np, backends)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"np": a.np, "cpus": os.cpu_count(), "machine": machine, "backends": backends, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
