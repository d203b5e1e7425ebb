"""Samples per second of a real training job: our DistributedOptimizer beside torch DDP on gloo.

Two models (``--model``). ``transformer`` (the default): a GPT-style language model
(bench_models.TransformerLM: d=256, 4 layers, 4 heads, sequence 128, vocabulary 2048, 3.7 M
parameters) trained with AdamW on a synthetic token stream (a fixed random Markov chain, so the
loss falls). ``resnet18``: bench_models.resnet18 (torchvision's layout, 11.7 M parameters in 62
tensors) trained with SGD on one fixed random batch of ``--image-size`` images per rank, the loop
of Horovod's synthetic benchmark. Both on CPU with a fixed batch per rank (weak scaling). One
invocation runs each implementation (``--impls``) at each rank count (``--ranks``, default 1,2),
each job started by ``appliance.launcher.launch``: ``ours`` (``appliance.torch.DistributedOptimizer``
+ ``broadcast_parameters``) and ``ddp-gloo`` (torch ``DistributedDataParallel`` on gloo). An impl
may carry environment settings for its ranks after ``+`` (``ours+HOROVOD_FUSION_THRESHOLD=4M``),
so knob values compare in one run. The jobs run in rounds (``--rounds``, default 3), the impls
alternating within each, and every row reports the median round: a slow minute of a shared
machine then spoils one round of every impl, not one of them.

    python benchmarks/train.py [--model resnet18] [--quick] [--rounds N] [--json out.json]
    python benchmarks/train.py --paired [--model resnet18] [--impls ours,ours+HOROVOD_FUSION_THRESHOLD=4M]
    python benchmarks/train.py --horovod-script PATH/pytorch_synthetic_benchmark.py

Torch threads per rank: the machine's cores divided by the largest rank count, the same at every
rank count (2 cores, ranks 1 and 2: 1 thread per rank), so scaling measures what data parallelism
costs, not how well one rank's ops use two threads; ``--threads`` to choose. samples/s = global
batch x timed steps / wall time of the timed steps (after warm-up steps, between barriers, on rank
0). Scaling efficiency = samples/s at N ranks / (N x samples/s at 1 rank); **ceiling** = N x the
1-rank samples/s of the same impl (perfect scaling). Each step's phases on rank 0 are timed too
(forward, backward, the wait for the gradients' allreduces, the optimizer's update; DDP's
allreduce wait is inside its backward), with the gradient bytes whose allreduce had already
completed when backward returned (``overlap``: ours only) and, after the timed steps, one
allreduce of a tensor of all the gradients' bytes alone (``allreduce ms``).

``--paired`` runs ours, DDP and ``local`` (each rank alone, no communication: the ceiling of any
allreduce scheme at this placement and load) in the same ranks, in alternating blocks of steps
(``train_paired.py``), and reports the median of the per-block ratios ours/DDP: on a machine
shared with other work this compares like with like where separate jobs cannot.

``--horovod-script PATH`` runs a Horovod PyTorch script as it is (Horovod's own
``examples/pytorch/pytorch_synthetic_benchmark.py``) through our launcher, ``import horovod.torch``
resolved to this project's ``horovod`` package (``shim/``), beside a twin of its loop on torch DDP
over gloo, and prints the img/sec each reports. Where torchvision cannot be imported (PyPI's
torchvision needs its own torch build), a stand-in ``torchvision.models`` whose ``resnet18`` is
bench_models' is put on both sides' path, and the table says so. ``OMP_NUM_THREADS`` is set for both
to the threads per rank. Fails with one line naming the script when it is missing or prints no
``Total img/sec``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import benchlib as bl

IMPLS = ("ours", "ddp-gloo")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse_impl(spec: str) -> tuple:
    """'ours+K=V+K2=V2' -> ('ours', {'K': 'V', 'K2': 'V2'}); raises ValueError naming the culprit."""
    base, *sets = spec.split("+")
    if base not in IMPLS:
        raise ValueError(f"unknown impl {base!r} in {spec!r}; choose from {', '.join(IMPLS)}")
    env = {}
    for s in sets:
        k, eq, v = s.partition("=")
        if not eq or not k:
            raise ValueError(f"{s!r} in {spec!r} is not KEY=VALUE")
        env[k] = v
    return base, env


def build(cfg, rank):
    """(model, optimizer, next_batch) for the configured model, the same on every impl."""
    import torch

    import bench_models as bm

    torch.manual_seed(0)
    if cfg["model"] == "resnet18":
        model = bm.resnet18()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(1000 + rank)
        data = torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"], generator=gen)
        target = torch.randint(0, 1000, (cfg["batch"],), generator=gen)
        return model, opt, lambda: (data, target), 1000
    model = bm.TransformerLM(vocab=cfg["vocab"], d=cfg["d"], layers=cfg["layers"], heads=cfg["heads"],
                             seq=cfg["seq"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = bm.synthetic_tokens(cfg["tokens"], cfg["vocab"], seed=0)
    gen = torch.Generator().manual_seed(1000 + rank)
    batch, seq = cfg["batch"], cfg["seq"]

    def next_batch():
        starts = torch.randint(0, len(tokens) - seq - 1, (batch,), generator=gen)
        return (torch.stack([tokens[s:s + seq] for s in starts]),
                torch.stack([tokens[s + 1:s + seq + 1] for s in starts]))
    return model, opt, next_batch, cfg["vocab"]


def stepper(net, opt, next_batch, classes, many, hvd):
    """(step(timed=False) -> loss, phases, overlap) of one side: a training step timed by phase
    (forward, backward, wait for the allreduces, update), and with ``many`` (ours at 2+ ranks) the
    gradient bytes already allreduced when backward returns, of all."""
    import torch

    phases = {"forward": 0.0, "backward": 0.0, "wait": 0.0, "update": 0.0}
    overlap = [0, 0]

    def step(timed=False):
        x, y = next_batch()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x).reshape(-1, classes), y.reshape(-1))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if many:
            if timed:
                for p, (handle, _) in list(opt._handles.items()):
                    nbytes = p.grad.numel() * p.grad.element_size()
                    overlap[1] += nbytes
                    overlap[0] += nbytes if handle is not None and hvd.poll(handle) else 0
            opt.synchronize()
        t3 = time.perf_counter()
        if many:
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        t4 = time.perf_counter()
        if timed:
            for k, dt in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                phases[k] += dt
        return float(loss)
    return step, phases, overlap


def worker(impl, cfg, out):
    import torch

    torch.set_num_threads(cfg["threads"])
    if impl == "ours":
        import appliance.torch as hvd

        hvd.init()
        rank, size, barrier = hvd.rank(), hvd.size(), hvd.barrier
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, size, barrier = dist.get_rank(), dist.get_world_size(), dist.barrier
    model, opt, next_batch, classes = build(cfg, rank)
    params = [p for p in model.parameters() if p.requires_grad]
    if impl == "ours":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        net = model
    else:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model)
    many = impl == "ours" and size > 1
    step, phases, overlap = stepper(net, opt, next_batch, classes, many, hvd if impl == "ours" else None)

    first = step()
    for _ in range(cfg["warmup"] - 1):
        step()
    barrier()
    t0 = time.perf_counter()
    for _ in range(cfg["steps"]):
        last = step(timed=True)
    barrier()
    elapsed = time.perf_counter() - t0
    allreduce_ms = None
    if size > 1:  # the gradients' bytes in one tensor, allreduced alone (median of 3)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        times = []
        for _ in range(3):
            barrier()
            t = time.perf_counter()
            if impl == "ours":
                hvd.allreduce_(flat, name="alone")
            else:
                dist.all_reduce(flat)
            times.append(time.perf_counter() - t)
        allreduce_ms = statistics.median(times) * 1e3
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"impl": impl, "ranks": size, "threads": cfg["threads"], "seconds": elapsed,
                       "samples_per_s": cfg["batch"] * size * cfg["steps"] / elapsed,
                       "step_ms": elapsed / cfg["steps"] * 1e3, "first_loss": first, "last_loss": last,
                       "phases_ms": {k: v / cfg["steps"] * 1e3 for k, v in phases.items()},
                       "overlap": overlap[0] / overlap[1] if overlap[1] else None,
                       "allreduce_ms": allreduce_ms}, f)
    if impl == "ours":
        hvd.shutdown()
    else:
        del net, opt  # DDP's reducer and its gloo work released before the group goes
        barrier()
        dist.destroy_process_group()


def run_job(spec, ranks, cfg, paired=False) -> dict:
    from appliance.launcher import launch

    impl, env = parse_impl(spec)
    out = bl.result_path(f"train-{impl}-{ranks}")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "paired" if paired else impl, "--cfg",
           json.dumps(cfg), "--out", out]
    res = launch(cmd, np=ranks, timeout=3600, env={**os.environ, **env})
    if res.returncode != 0:
        raise SystemExit(f"{spec} at {ranks} ranks failed (rc={res.returncode}):\n{bl.ranks_output(res)}")
    with open(out) as f:
        return {**json.load(f), "impl": spec}


def median_run(results: list, key: str = "samples_per_s") -> dict:
    """The run with the median ``key`` (the lower middle one of an even count), with every
    run's value under "rounds"."""
    ordered = sorted(results, key=lambda r: r[key])
    return {**ordered[(len(ordered) - 1) // 2], "rounds": [r[key] for r in results]}


def describe(cfg) -> str:
    if cfg["model"] == "resnet18":
        return (f"ResNet-18 (bench_models), SGD, one fixed batch of {cfg['batch']} x 3 x {cfg['image']} x "
                f"{cfg['image']} per rank")
    return (f"TransformerLM d={cfg['d']}, {cfg['layers']} layers, {cfg['heads']} heads, seq {cfg['seq']}, "
            f"vocab {cfg['vocab']}, AdamW, batch {cfg['batch']} per rank")


def print_table(rows, cfg, file=sys.stdout):
    threads = ", ".join(f"{r} at {n} rank{'s' if n > 1 else ''}"
                        for n, r in sorted({(r["ranks"], r["threads"]) for r in rows}))
    print(f"\ntraining: {describe(cfg)}, {cfg['steps']} timed steps after {cfg['warmup']} warm-up; "
          f"torch threads per rank: {threads}; {os.cpu_count()} cores", file=file)
    w = max(9, *(len(r["impl"]) for r in rows))
    print(f"{'impl':>{w}} {'ranks':>5} {'threads':>7} {'samples/s':>10} {'step ms':>8} {'loss':>13} {'scaling':>8}"
          "  samples/s of each round", file=file)
    one = {r["impl"]: r for r in rows if r["ranks"] == 1}
    for r in rows:
        base = one.get(r["impl"])
        eff = f"{r['samples_per_s'] / (r['ranks'] * base['samples_per_s']):.2f}" if base and r["ranks"] > 1 else "-"
        print(f"{r['impl']:>{w}} {r['ranks']:>5} {r['threads']:>7} {r['samples_per_s']:>10.1f} {r['step_ms']:>8.1f} "
              f"{r['first_loss']:>6.2f}->{r['last_loss']:<5.2f} {eff:>8}  "
              + " ".join(f"{x:.1f}" for x in r.get("rounds", [r["samples_per_s"]])), file=file)
    print(f"\nphases of the median round, ms per step on rank 0 (wait: ours' synchronize; DDP's is in backward)",
          file=file)
    print(f"{'impl':>{w}} {'ranks':>5} {'forward':>8} {'backward':>8} {'wait':>7} {'update':>7} {'overlap':>8} "
          f"{'allreduce ms':>12} {'ceiling':>8}", file=file)
    for r in rows:
        ph, base = r.get("phases_ms", {}), one.get(r["impl"])
        ceiling = f"{r['ranks'] * base['samples_per_s']:.1f}" if base and r["ranks"] > 1 else "-"
        ov = "-" if r.get("overlap") is None else f"{100 * r['overlap']:.0f}%"
        ar = "-" if r.get("allreduce_ms") is None else f"{r['allreduce_ms']:.1f}"
        print(f"{r['impl']:>{w}} {r['ranks']:>5} " + " ".join(f"{ph.get(k, 0):>{n}.1f}" for k, n in
              (("forward", 8), ("backward", 8), ("wait", 7), ("update", 7))) + f" {ov:>8} {ar:>12} {ceiling:>8}",
              file=file)
    ddp = {r["ranks"]: r for r in rows if r["impl"] == "ddp-gloo"}
    for r in rows:
        if r["impl"] != "ddp-gloo" and r["ranks"] in ddp:
            n = r["ranks"]
            print(f"{r['impl']} / ddp-gloo samples/s at {n} rank{'s' if n > 1 else ''}: "
                  f"{r['samples_per_s'] / ddp[n]['samples_per_s']:.2f}", file=file)
    if 1 in ddp:
        for n, d in ddp.items():
            if n > 1:
                print(f"ceiling / ddp-gloo at {n} ranks ({n} x ddp-gloo's 1-rank samples/s, perfect scaling): "
                      f"{n * ddp[1]['samples_per_s'] / d['samples_per_s']:.2f}", file=file)
    print("scaling: samples/s at N ranks / (N x samples/s at 1 rank) of the same impl; ceiling: N x that 1-rank "
          "samples/s", file=file)


def model_cfg(a) -> dict:
    if a.model == "resnet18":
        if a.quick:
            return dict(model="resnet18", batch=2, image=32, steps=a.steps or 3, warmup=1)
        return dict(model="resnet18", batch=a.batch or 8, image=a.image_size, steps=a.steps or 8, warmup=2)
    if a.quick:
        return dict(model="transformer", vocab=256, d=64, layers=1, heads=2, seq=32, batch=4, steps=a.steps or 3,
                    warmup=1, tokens=4096)
    return dict(model="transformer", vocab=2048, d=256, layers=4, heads=4, seq=128, batch=a.batch or 16,
                steps=a.steps or 20, warmup=3, tokens=65536)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("transformer", "resnet18"), default="transformer")
    p.add_argument("--ranks", default="1,2", help="comma list of rank counts (default 1,2)")
    p.add_argument("--impls", default=",".join(IMPLS),
                   help="comma list of " + ", ".join(IMPLS) + ", each optionally +KEY=VALUE... for its ranks")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20; resnet18 8)")
    p.add_argument("--batch", type=int, default=None, help="samples per rank per step (default 16; resnet18 8)")
    p.add_argument("--image-size", type=int, default=224, help="resnet18 and --horovod-script: image side")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per rank (default: cores / the largest rank count)")
    p.add_argument("--rounds", type=int, default=None, help="rounds of every job (default 3; 1 with --quick)")
    p.add_argument("--horovod-script", metavar="PATH",
                   help="run this Horovod synthetic benchmark script unchanged beside its DDP twin")
    p.add_argument("--paired", action="store_true",
                   help="ours, ddp-gloo and local (no communication) in the same ranks, in alternating blocks")
    p.add_argument("--blocks", type=int, default=None, help="--paired: blocks of each side (default 6)")
    p.add_argument("--block", type=int, default=None, help="--paired: steps per block (default 2; transformer 4)")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke: a tiny model, 3 steps")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--worker", choices=IMPLS + ("hvd-twin", "paired"), help=argparse.SUPPRESS)
    p.add_argument("--cfg", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker == "hvd-twin":
        import train_hvd

        train_hvd.twin(json.loads(a.cfg))
        return 0
    if a.worker == "paired":
        import train_paired

        train_paired.worker(json.loads(a.cfg), a.out)
        return 0
    if a.worker:
        worker(a.worker, json.loads(a.cfg), a.out)
        return 0
    rank_counts = [int(x) for x in a.ranks.split(",")]
    threads = a.threads or bl.threads_per_rank(max(rank_counts))
    rounds = max(1, a.rounds or (1 if a.quick else 3))
    if a.horovod_script:
        import train_hvd

        return train_hvd.main(a, rank_counts, threads, rounds)
    specs = [i for i in a.impls.split(",") if i]
    if a.paired and a.impls == ",".join(IMPLS):
        specs = ["ours"]
    for s in specs:
        try:
            parse_impl(s)
        except ValueError as e:
            p.error(str(e))
    cfg = model_cfg(a)
    machine = bl.machine_line()
    if a.paired:
        import train_paired

        if any(parse_impl(s)[0] != "ours" for s in specs):
            p.error("--paired runs ddp-gloo and local in every job: give --impls as ours[+KEY=VALUE...] only")
        cfg.update(blocks=a.blocks or (2 if a.quick else 6),
                   block=a.block or (1 if a.quick else 2 if cfg["model"] == "resnet18" else 4))
        rows = train_paired.run(specs, rank_counts, {**cfg, "threads": threads},
                                rounds, lambda spec, ranks, c: run_job(spec, ranks, c, paired=True))
        print(machine)
        print(f"\ntraining: {describe(cfg)}, {cfg['blocks']} blocks of {cfg['block']} steps per side after "
              f"{cfg['warmup']} warm-up; torch threads per rank: {threads}; {os.cpu_count()} cores")
        train_paired.print_rows(rows)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"cpus": os.cpu_count(), "machine": machine, "config": cfg, "paired": rows}, f, indent=1)
        return 0
    runs: dict = {}
    for ranks in rank_counts:
        for _ in range(rounds):
            for spec in specs:
                runs.setdefault((spec, ranks), []).append(run_job(spec, ranks, {**cfg, "threads": threads}))
    rows = [median_run(rs) for rs in runs.values()]
    print(machine)
    print_table(rows, cfg)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpus": os.cpu_count(), "machine": machine, "config": cfg, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
