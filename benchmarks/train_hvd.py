"""train.py --horovod-script: a Horovod PyTorch synthetic benchmark script, run as it is on our
ranks, beside a twin of its loop on torch DDP over gloo.

Not a package module: train.py imports it as a sibling. The script (Horovod's
``examples/pytorch/pytorch_synthetic_benchmark.py``, not part of this repository) runs through
``appliance.launcher.launch`` with ``shim/`` (this project's ``horovod`` package), the repository
and this directory on ``PYTHONPATH``, and ``--model resnet18 --batch-size B --num-warmup-batches W
--num-batches-per-iter K --num-iters N``; its rank 0 prints ``Total img/sec on N CPU(s): X +-Y``,
which is read back. The twin (``twin()``, run by ``train.py --worker hvd-twin``) does the same
steps (the same model from ``torchvision.models``, SGD at 0.01 x size, one fixed random batch,
zero_grad/forward/cross-entropy/backward/step, ``timeit`` of K steps per iteration) with the model
wrapped in ``DistributedDataParallel`` and prints the same line. Where ``torchvision`` does not
import here, both sides get a stand-in package (a temporary directory, removed after) whose
``models.resnet18`` is ``bench_models.resnet18``. Reads ``OMP_NUM_THREADS`` nowhere itself: it sets
it for both sides' ranks to the threads per rank.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from contextlib import contextmanager

import benchlib as bl

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOTAL = re.compile(r"Total img/sec on (\d+) \S+: ([0-9.]+) \+-([0-9.]+)")


def twin(cfg) -> None:
    """The DDP-on-gloo twin of the synthetic benchmark's loop; rank 0 prints the same lines."""
    import timeit

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torchvision import models

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    model = getattr(models, cfg["model"])()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size)
    model = DistributedDataParallel(model)  # broadcasts rank 0's parameters, as broadcast_parameters
    data = torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"])
    target = torch.LongTensor(cfg["batch"]).random_() % 1000

    def benchmark_step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    timeit.timeit(benchmark_step, number=cfg["warmup"])
    img_secs = []
    for x in range(cfg["iters"]):
        t = timeit.timeit(benchmark_step, number=cfg["per_iter"])
        img_secs.append(cfg["batch"] * cfg["per_iter"] / t)
        if rank == 0:
            print(f"Iter #{x}: {img_secs[-1]:.1f} img/sec per CPU", flush=True)
    if rank == 0:
        mean, conf = statistics.fmean(img_secs), 1.96 * statistics.pstdev(img_secs)
        print(f"Total img/sec on {size} CPU(s): {size * mean:.1f} +-{size * conf:.1f}", flush=True)
    dist.destroy_process_group()


@contextmanager
def torchvision_path():
    """(extra PYTHONPATH entries, 'torchvision' or the stand-in's description)."""
    probe = subprocess.run([sys.executable, "-c", "from torchvision import models; models.resnet18"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode == 0:
        yield [], "torchvision"
        return
    tmp = tempfile.mkdtemp(prefix="appliance-tv-")
    try:
        pkg = os.path.join(tmp, "torchvision")
        os.mkdir(pkg)
        with open(os.path.join(pkg, "__init__.py"), "w") as f:
            f.write('"""Stand-in for torchvision (benchmarks/train_hvd.py): models.resnet18 only."""\n'
                    "from . import models  # noqa: F401\n")
        with open(os.path.join(pkg, "models.py"), "w") as f:
            f.write("from bench_models import resnet18  # noqa: F401\n")
        yield [tmp], "a stand-in torchvision.models (bench_models.resnet18; torchvision does not import here)"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_one(kind, script, ranks, cfg, env) -> dict:
    from appliance.launcher import launch

    if kind == "horovod-script":
        cmd = [sys.executable, script, "--model", cfg["model"], "--batch-size", str(cfg["batch"]),
               "--num-warmup-batches", str(cfg["warmup"]), "--num-batches-per-iter", str(cfg["per_iter"]),
               "--num-iters", str(cfg["iters"])]
    else:
        cmd = [sys.executable, os.path.join(HERE, "train.py"), "--worker", "hvd-twin", "--cfg", json.dumps(cfg)]
    res = launch(cmd, np=ranks, timeout=3600, env=env)
    text = res.output(stream="stdout")
    m = TOTAL.search(text)
    if res.returncode != 0 or not m:
        raise SystemExit(f"{kind} ({script}) at {ranks} ranks: rc={res.returncode}, no 'Total img/sec' line:\n"
                         f"{bl.ranks_output(res)}")
    return {"impl": kind, "ranks": int(m.group(1)), "img_per_s": float(m.group(2)), "conf": float(m.group(3)),
            "iters": [float(x) for x in re.findall(r"Iter #\d+: ([0-9.]+) img/sec", text)]}


def main(a, rank_counts, threads, rounds) -> int:
    script = os.path.abspath(a.horovod_script)
    if not os.path.isfile(script):
        raise SystemExit(f"--horovod-script: {a.horovod_script}: no such file")
    if a.quick:
        cfg = dict(model="resnet18", batch=2, image=224, warmup=1, per_iter=1, iters=2)
    else:
        cfg = dict(model="resnet18", batch=a.batch or 8, image=224, warmup=2, per_iter=3, iters=3)
    machine = bl.machine_line()
    runs: dict = {}
    with torchvision_path() as (extra, tv):
        path = os.pathsep.join([os.path.join(ROOT, "shim"), ROOT, HERE, *extra,
                                *filter(None, [os.environ.get("PYTHONPATH")])])
        env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": str(threads)}
        for ranks in rank_counts:
            for _ in range(rounds):
                for kind in ("horovod-script", "ddp-twin"):
                    runs.setdefault((kind, ranks), []).append(run_one(kind, script, ranks, cfg, env))
    from train import median_run

    rows = [median_run(rs, key="img_per_s") for rs in runs.values()]
    print(machine)
    print(f"\nHorovod's synthetic benchmark: {script}\n  --model resnet18 --batch-size {cfg['batch']} "
          f"--num-warmup-batches {cfg['warmup']} --num-batches-per-iter {cfg['per_iter']} --num-iters "
          f"{cfg['iters']} (images {cfg['image']} x {cfg['image']}); models from {tv}; OMP_NUM_THREADS={threads}; "
          f"horovod-script: the script on our ranks (shim/horovod), ddp-twin: its loop on DDP over gloo")
    print(f"{'impl':>14} {'ranks':>5} {'img/sec':>8} {'+-':>6}  img/sec of each round")
    for r in rows:
        print(f"{r['impl']:>14} {r['ranks']:>5} {r['img_per_s']:>8.1f} {r['conf']:>6.1f}  "
              + " ".join(f"{x:.1f}" for x in r["rounds"]))
    got = {(r["impl"], r["ranks"]): r["img_per_s"] for r in rows}
    for n in rank_counts:
        if ("horovod-script", n) in got and ("ddp-twin", n) in got:
            print(f"horovod-script / ddp-twin img/sec at {n} rank{'s' if n > 1 else ''}: "
                  f"{got['horovod-script', n] / got['ddp-twin', n]:.2f}")
    if ("ddp-twin", 1) in got:
        for n in rank_counts:
            if n > 1 and ("ddp-twin", n) in got:
                print(f"ceiling / ddp-twin at {n} ranks ({n} x its 1-rank img/sec): "
                      f"{n * got['ddp-twin', 1] / got['ddp-twin', n]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpus": os.cpu_count(), "machine": machine, "script": script, "torchvision": tv,
                       "config": cfg, "threads": threads, "rows": rows}, f, indent=1)
    return 0
