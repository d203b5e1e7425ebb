"""CUDA allreduce bandwidth: our runtime's NCCL path beside torch.distributed's NCCL backend.

One run starts N ranks on this host (default: one per GPU) with ``appliance.launcher.launch``;
each rank pins ``cuda:<local rank>``, initialises our runtime and an NCCL process group, and for
each size times both, interleaved, on the same GPUs. Timing includes the host wait for the
result (``hvd.allreduce_`` returns once the device work is done; torch's side is followed by
``torch.cuda.synchronize()``). Prints medians of the slowest rank and the ratio torch/ours
(above 1 = we are faster). Needs CUDA GPUs; on a machine without one it says so and exits 2.

    python benchmarks/nccl_allreduce.py                       # 1 MiB .. 1 GiB, float32
    python benchmarks/nccl_allreduce.py --np 2 --sizes 1M,64M --json out.json

busbw follows the nccl-tests convention: bytes * 2 (P-1) / P / time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import human, iters_for, parse_size, ranks_output, result_path, time_op  # noqa: E402


def worker(sizes, iters, out):
    import torch
    import torch.distributed as dist

    import appliance.torch as hvd

    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", rank=hvd.rank(), world_size=hvd.size(), device_id=dev)
    results = []
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        a = torch.ones(n, dtype=torch.float32, device=dev)
        t = torch.ones(n, dtype=torch.float32, device=dev)
        k = iters_for(nbytes, iters)

        def theirs():
            dist.all_reduce(t)
            torch.cuda.synchronize()

        def ours():
            hvd.allreduce_(a, op=hvd.Sum, name="bench")

        for _ in range(3):
            ours()
            theirs()
        o, g = [], []
        for _ in range(3):
            o += time_op(ours, k // 3 + 1)
            g += time_op(theirs, k // 3 + 1)
        med = torch.tensor([statistics.median(o), statistics.median(g)], dtype=torch.float64)
        med = hvd.allreduce(med, op=hvd.Max, name="bench.med")
        results.append({"bytes": n * 4, "ours": float(med[0]), "torch_nccl": float(med[1]), "iters": len(o)})
    if hvd.rank() == 0:
        from appliance.runtime import engine
        with open(out, "w") as f:
            json.dump({"rows": results, "path": list(engine.cuda_path()), "nccl": hvd.nccl_built()}, f)
    dist.destroy_process_group()
    hvd.shutdown()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=0, help="ranks (default: one per GPU)")
    p.add_argument("--sizes", default="1M,4M,16M,64M,256M,1G")
    p.add_argument("--iters", type=int, default=60, help="samples per size at 1 MiB (scaled by size)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    if a.worker:
        worker(sizes, a.iters, a.out)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("nccl_allreduce: no CUDA device here; nothing to measure", file=sys.stderr)
        return 2
    P = a.np or torch.cuda.device_count()
    from appliance.launcher import launch

    out = result_path("nccl")
    res = launch([sys.executable, __file__, "--worker", "--sizes", ",".join(map(str, sizes)),
                  "--iters", str(a.iters), "--out", out], np=P, timeout=1800)
    if res.returncode != 0:
        print(ranks_output(res), file=sys.stderr)
        return res.returncode
    with open(out) as f:
        data = json.load(f)
    print(f"allreduce float32 on CUDA, {P} rank(s) on {torch.cuda.get_device_name(0)}; our path: "
          f"{data['path'][0] or '?'} (NCCL {data['nccl']}); median of the slowest rank")
    print(f"{'size':>6} {'ours us':>10} {'torch us':>10} {'torch/ours':>10} {'ours busbw':>11} {'torch busbw':>12}")
    for r in data["rows"]:
        f = 2 * (P - 1) / P if P > 1 else 1.0
        print(f"{human(r['bytes']):>6} {r['ours'] * 1e6:>10.1f} {r['torch_nccl'] * 1e6:>10.1f} "
              f"{r['torch_nccl'] / r['ours']:>10.2f} {r['bytes'] * f / r['ours'] / 1e9:>11.2f} "
              f"{r['bytes'] * f / r['torch_nccl'] / 1e9:>12.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"np": P, **data}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
