"""train.py --paired: ours, DDP on gloo and no communication at all in the same ranks, alternating.

Not a package module: train.py imports it as a sibling. Each job's ranks initialise both our
runtime (``appliance.torch``) and torch.distributed on gloo and build three copies of the model
(train.build, the same seed): ``ours`` (DistributedOptimizer), ``ddp-gloo``
(DistributedDataParallel) and ``local`` (the bare optimizer: each rank trains alone, no gradient
leaves it). After warm-up steps of each, they take turns in blocks of ``block`` steps between
barriers, the order reversed every block, so a burst of other work on a shared machine falls on
all three alike. ``local`` is the ceiling any allreduce scheme can reach with these ranks, this
placement and this machine's load: what remains between it and an implementation is that
implementation's communication (exposed or stealing cycles from the compute). Per side: samples/s
over all its blocks, the per-step phases as train.py's, and per block pair the ratio ours/ddp
(``paired``: the median of those ratios). An impl spec's ``+KEY=VALUE`` settings apply to the whole
job (our knobs are read at init; DDP and local ignore them).
"""
from __future__ import annotations

import json
import statistics
import time

SIDES = ("ours", "ddp-gloo", "local")


def make_side(kind, cfg, rank, size, hvd):
    """(step(timed) -> loss, phases, overlap) of one side."""
    from train import build, stepper

    model, opt, next_batch, classes = build(cfg, rank)
    net, many = model, False
    if kind == "ours":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        many = size > 1
    elif kind == "ddp-gloo":
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model)
    step, phases, overlap = stepper(net, opt, next_batch, classes, many, hvd)
    return step, phases, overlap


def worker(cfg, out):
    import torch
    import torch.distributed as dist

    import appliance.torch as hvd

    torch.set_num_threads(cfg["threads"])
    hvd.init()
    dist.init_process_group("gloo")
    rank, size = hvd.rank(), hvd.size()
    sides = {k: make_side(k, cfg, rank, size, hvd) for k in SIDES}
    first, last = {}, {}
    for k, (step, _, _) in sides.items():
        first[k] = step(False)
        for _ in range(cfg["warmup"] - 1):
            step(False)
    times = {k: [] for k in SIDES}
    for b in range(cfg["blocks"]):
        for k in (SIDES if b % 2 == 0 else SIDES[::-1]):
            step = sides[k][0]
            hvd.barrier()
            t = time.perf_counter()
            for _ in range(cfg["block"]):
                last[k] = step(True)
            hvd.barrier()
            times[k].append(time.perf_counter() - t)
    steps = cfg["blocks"] * cfg["block"]
    if rank == 0:
        rows = []
        for k, (_, phases, overlap) in sides.items():
            total = sum(times[k])
            rows.append({"side": k, "ranks": size, "threads": cfg["threads"],
                         "samples_per_s": cfg["batch"] * size * steps / total, "step_ms": total / steps * 1e3,
                         "first_loss": first[k], "last_loss": last[k],
                         "phases_ms": {n: v / steps * 1e3 for n, v in phases.items()},
                         "overlap": overlap[0] / overlap[1] if overlap[1] else None, "blocks_s": times[k]})
        paired = statistics.median(d / o for d, o in zip(times["ddp-gloo"], times["ours"]))
        with open(out, "w") as f:
            json.dump({"ranks": size, "sides": rows, "paired_ours_over_ddp": paired}, f)
    dist.destroy_process_group()
    hvd.shutdown()


def run(specs, rank_counts, cfg, rounds, launch_job) -> list:
    """Every spec's paired job ``rounds`` times at each rank count, specs alternating within a
    round; one summary row per (spec, ranks): the median round's sides and the paired ratios."""
    runs: dict = {}
    for ranks in rank_counts:
        for _ in range(rounds):
            for spec in specs:
                runs.setdefault((spec, ranks), []).append(launch_job(spec, ranks, cfg))
    rows = []
    for (spec, ranks), results in runs.items():
        ordered = sorted(results, key=lambda r: r["paired_ours_over_ddp"])
        mid = ordered[(len(ordered) - 1) // 2]
        rows.append({"impl": spec, "ranks": ranks, "paired_ours_over_ddp": mid["paired_ours_over_ddp"],
                     "rounds": [r["paired_ours_over_ddp"] for r in results], "sides": mid["sides"],
                     "all": results})
    return rows


def print_rows(rows, file=None) -> None:
    print("\npaired: ours, ddp-gloo and local (no communication) in the same ranks, blocks alternating; "
          "the round with the median paired ratio", file=file)
    w = max(9, *(len(r["impl"]) for r in rows))
    print(f"{'job':>{w}} {'ranks':>5} {'side':>8} {'samples/s':>10} {'step ms':>8} {'forward':>8} {'backward':>8} "
          f"{'wait':>6} {'update':>6} {'overlap':>7}", file=file)
    for r in rows:
        for s in r["sides"]:
            ph = s["phases_ms"]
            ov = "-" if s["overlap"] is None else f"{100 * s['overlap']:.0f}%"
            print(f"{r['impl']:>{w}} {r['ranks']:>5} {s['side']:>8} {s['samples_per_s']:>10.2f} {s['step_ms']:>8.1f} "
                  f"{ph['forward']:>8.1f} {ph['backward']:>8.1f} {ph['wait']:>6.1f} {ph['update']:>6.1f} {ov:>7}",
                  file=file)
    for r in rows:
        by = {s["side"]: s["samples_per_s"] for s in r["sides"]}
        print(f"{r['impl']} at {r['ranks']} rank{'s' if r['ranks'] > 1 else ''}: ours/ddp-gloo paired (median of "
              f"block pairs) {r['paired_ours_over_ddp']:.3f} (rounds " + " ".join(f"{x:.3f}" for x in r["rounds"])
              + f"); over all blocks ours/ddp {by['ours'] / by['ddp-gloo']:.3f}, local/ddp {by['local'] / by['ddp-gloo']:.3f},"
              f" local/ours {by['local'] / by['ours']:.3f}", file=file)
    print("local/ddp-gloo is the most any allreduce scheme could gain over DDP with these ranks at this load",
          file=file)


