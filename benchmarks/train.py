"""Samples per second of a real training job: our DistributedOptimizer beside torch DDP on gloo.

The job: a GPT-style transformer language model (bench_models.TransformerLM: d=256, 4 layers,
4 heads, sequence 128, vocabulary 2048, 3.7 M parameters) trained with AdamW on CPU on a
synthetic token stream (a fixed random Markov chain, so the loss falls), a fixed batch per rank
(weak scaling). One invocation runs four jobs, each started by ``appliance.launcher.launch``:
ours (``appliance.torch.DistributedOptimizer`` + ``broadcast_parameters``) and torch
``DistributedDataParallel`` on gloo, each at 1 and 2 ranks (``--ranks`` to choose). The jobs run
in rounds (``--rounds``, default 3), ours and DDP alternating within each, and every row reports
the median round: a slow minute of a shared machine then spoils one round of both, not one side.

    python benchmarks/train.py [--quick] [--rounds N] [--json out.json]

Torch threads per rank: the machine's cores divided by the largest rank count, the same at every
rank count (2 cores, ranks 1 and 2: 1 thread per rank), so scaling measures what data parallelism
costs, not how well one rank's ops use two threads (and a busy machine does not stall a lone rank's
spinning OpenMP threads); ``--threads`` to choose. Printed with the table. samples/s = global batch x timed steps
/ wall time of the timed steps (after warm-up steps, between barriers, on rank 0). Scaling
efficiency = samples/s at N ranks / (N x samples/s at 1 rank).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import benchlib as bl

IMPLS = ("ours", "ddp-gloo")


def worker(impl, cfg, out):
    import torch

    import bench_models as bm

    torch.set_num_threads(cfg["threads"])
    if impl == "ours":
        import appliance.torch as hvd

        hvd.init()
        rank, size, barrier = hvd.rank(), hvd.size(), hvd.barrier
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, size, barrier = dist.get_rank(), dist.get_world_size(), dist.barrier
    torch.manual_seed(0)
    model = bm.TransformerLM(vocab=cfg["vocab"], d=cfg["d"], layers=cfg["layers"], heads=cfg["heads"],
                             seq=cfg["seq"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if impl == "ours":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        net = model
    else:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model)
    tokens = bm.synthetic_tokens(cfg["tokens"], cfg["vocab"], seed=0)
    gen = torch.Generator().manual_seed(1000 + rank)
    batch, seq = cfg["batch"], cfg["seq"]

    def step():
        starts = torch.randint(0, len(tokens) - seq - 1, (batch,), generator=gen)
        x = torch.stack([tokens[s:s + seq] for s in starts])
        y = torch.stack([tokens[s + 1:s + seq + 1] for s in starts])
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x).reshape(-1, cfg["vocab"]), y.reshape(-1))
        loss.backward()
        opt.step()
        return float(loss)

    first = step()
    for _ in range(cfg["warmup"] - 1):
        step()
    barrier()
    t0 = time.perf_counter()
    for _ in range(cfg["steps"]):
        last = step()
    barrier()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"impl": impl, "ranks": size, "threads": cfg["threads"], "seconds": elapsed,
                       "samples_per_s": batch * size * cfg["steps"] / elapsed,
                       "step_ms": elapsed / cfg["steps"] * 1e3, "first_loss": first, "last_loss": last}, f)
    if impl == "ours":
        hvd.shutdown()
    else:
        dist.destroy_process_group()


def run_job(impl, ranks, cfg) -> dict:
    from appliance.launcher import launch

    out = bl.result_path(f"train-{impl}-{ranks}")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", impl, "--cfg", json.dumps(cfg), "--out", out]
    res = launch(cmd, np=ranks, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"{impl} at {ranks} ranks failed (rc={res.returncode}):\n{bl.ranks_output(res)}")
    with open(out) as f:
        return json.load(f)


def median_run(results: list) -> dict:
    """The run with the median samples/s (the lower middle one of an even count), with every
    run's samples/s under "rounds"."""
    ordered = sorted(results, key=lambda r: r["samples_per_s"])
    return {**ordered[(len(ordered) - 1) // 2], "rounds": [r["samples_per_s"] for r in results]}


def print_table(rows, cfg, file=sys.stdout):
    threads = ", ".join(f"{r} at {n} rank{'s' if n > 1 else ''}"
                        for n, r in sorted({(r["ranks"], r["threads"]) for r in rows}))
    print(f"\ntraining: TransformerLM d={cfg['d']}, {cfg['layers']} layers, {cfg['heads']} heads, seq {cfg['seq']}, "
          f"vocab {cfg['vocab']}, AdamW, batch {cfg['batch']} per rank, {cfg['steps']} timed steps after "
          f"{cfg['warmup']} warm-up; torch threads per rank: {threads}; {os.cpu_count()} cores", file=file)
    print(f"{'impl':>9} {'ranks':>5} {'threads':>7} {'samples/s':>10} {'step ms':>8} {'loss':>13} {'scaling':>8}"
          "  samples/s of each round", file=file)
    one = {r["impl"]: r for r in rows if r["ranks"] == 1}
    for r in rows:
        base = one.get(r["impl"])
        eff = f"{r['samples_per_s'] / (r['ranks'] * base['samples_per_s']):.2f}" if base and r["ranks"] > 1 else "-"
        print(f"{r['impl']:>9} {r['ranks']:>5} {r['threads']:>7} {r['samples_per_s']:>10.1f} {r['step_ms']:>8.1f} "
              f"{r['first_loss']:>6.2f}->{r['last_loss']:<5.2f} {eff:>8}  "
              + " ".join(f"{x:.1f}" for x in r.get("rounds", [r["samples_per_s"]])), file=file)
    for n in sorted({r["ranks"] for r in rows}):
        got = {r["impl"]: r["samples_per_s"] for r in rows if r["ranks"] == n}
        if len(got) == 2:
            print(f"ours / ddp-gloo samples/s at {n} rank{'s' if n > 1 else ''}: "
                  f"{got['ours'] / got['ddp-gloo']:.2f}", file=file)
    print("scaling: samples/s at N ranks / (N x samples/s at 1 rank) of the same impl", file=file)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="1,2", help="comma list of rank counts (default 1,2)")
    p.add_argument("--impls", default=",".join(IMPLS), help="comma list of " + ", ".join(IMPLS))
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20)")
    p.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per rank (default: cores / the largest rank count)")
    p.add_argument("--rounds", type=int, default=None, help="rounds of every job (default 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke: a tiny model, 3 steps")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    p.add_argument("--cfg", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a.worker, json.loads(a.cfg), a.out)
        return 0
    impls = [i for i in a.impls.split(",") if i]
    if any(i not in IMPLS for i in impls):
        p.error(f"unknown impl in {a.impls!r}; choose from {', '.join(IMPLS)}")
    if a.quick:
        cfg = dict(vocab=256, d=64, layers=1, heads=2, seq=32, batch=4, steps=a.steps or 3, warmup=1, tokens=4096)
    else:
        cfg = dict(vocab=2048, d=256, layers=4, heads=4, seq=128, batch=a.batch, steps=a.steps or 20, warmup=3,
                   tokens=65536)
    machine = bl.machine_line()
    rank_counts = [int(x) for x in a.ranks.split(",")]
    # The same threads per rank at every rank count: the cores shared by the most ranks run.
    threads = a.threads or bl.threads_per_rank(max(rank_counts))
    rounds = max(1, a.rounds or (1 if a.quick else 3))
    runs: dict = {}
    for ranks in rank_counts:
        for _ in range(rounds):
            for impl in impls:
                runs.setdefault((impl, ranks), []).append(run_job(impl, ranks, {**cfg, "threads": threads}))
    rows = [median_run(rs) for rs in runs.values()]
    print(machine)
    print_table(rows, cfg)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpus": os.cpu_count(), "machine": machine, "config": cfg, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
