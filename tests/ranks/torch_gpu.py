"""Worker for tests/torch/test_cuda_tensors.py (gpu tier): appliance.torch on CUDA tensors, checked
against torch on one process.

Usage: torch_gpu.py ops|optimizer. Env: TORCH_GPU_PIN=N pins every rank to cuda:N (ranks
sharing a GPU); otherwise rank r uses cuda:(local_rank % device_count). Reports the CUDA path
the job took, nccl_built(), and how many results were checked.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _report import report  # noqa: E402

import appliance.torch as hvd  # noqa: E402
from appliance.runtime import engine  # noqa: E402

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int32, torch.int64]
STAGED = [torch.int16, torch.bool]  # NCCL lacks their reductions: host staging per entry


def inp(rank, dtype, n, dev, salt=0):
    g = torch.Generator().manual_seed(1000 * rank + 17 * n + salt)
    x = torch.randint(1, 4, (n,), generator=g)
    return (x % 2).bool().to(dev) if dtype == torch.bool else x.to(dtype).to(dev)


def close(a, b, dtype):
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-5)
    return torch.allclose(a.double().cpu(), b.double().cpu(), rtol=tol, atol=tol)


def ops(dev, P, R):
    checked = 0
    for dtype in FLOATS + INTS + STAGED:
        n = 1001
        xs = [inp(r, dtype, n, "cpu") for r in range(P)]
        stack = torch.stack([x.double() for x in xs])
        ops_ = [hvd.Sum, hvd.Min, hvd.Max] + ([hvd.Average, hvd.Product] if dtype in FLOATS else [])
        for op in ops_:
            if dtype == torch.bool and op not in (hvd.Min, hvd.Max):
                continue
            want = {hvd.Sum: stack.sum(0), hvd.Average: stack.mean(0), hvd.Min: stack.min(0).values,
                    hvd.Max: stack.max(0).values, hvd.Product: stack.prod(0)}[op]
            got = hvd.allreduce(xs[R].to(dev), op=op, name=f"ar.{dtype}.{op}")
            assert got.device == dev and got.dtype == dtype, (got.device, got.dtype)
            assert close(got, want, dtype), (dtype, op)
            checked += 1
        if dtype in FLOATS:  # scale factors on the device
            got = hvd.allreduce(xs[R].to(dev), op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name=f"sc.{dtype}")
            assert close(got, stack.sum(0) * 1.5, dtype), dtype
            checked += 1
        # allgather with a different first dimension per rank
        g = torch.full((R + 1, 3), R, dtype=torch.int64).to(dtype).to(dev)
        got = hvd.allgather(g, name=f"ag.{dtype}")
        assert got.device == dev and got.shape == (P * (P + 1) // 2, 3)
        assert [int(v) for v in got[:, 0].cpu().long()] == [int(torch.tensor(q).to(dtype)) for q in range(P) for _ in range(q + 1)]
        checked += 1
        b = xs[R].to(dev).clone()
        hvd.broadcast_(b, root_rank=P - 1, name=f"bc.{dtype}")
        assert torch.equal(b.cpu(), xs[P - 1])
        checked += 1
        rows = [p + 1 for p in range(P)]
        t = torch.cat([torch.full((rows[p], 2), 10 * R + p) for p in range(P)]).to(dtype).to(dev)
        got, splits = hvd.alltoall(t, splits=torch.tensor(rows, dtype=torch.int32), name=f"a2a.{dtype}")
        assert splits.tolist() == [R + 1] * P and got.device == dev
        want = torch.tensor([10 * q + R for q in range(P) for _ in range(R + 1)]).to(dtype)
        assert torch.equal(got[:, 0].cpu(), want)
        checked += 1
        if dtype != torch.bool:
            m = torch.stack([xs[R][:5]] * 4, dim=1).to(dev)  # 5 rows: uneven over 2 and 3 ranks
            got = hvd.reducescatter(m, op=hvd.Sum, name=f"rs.{dtype}")
            mine = 5 // P + (1 if R < 5 % P else 0)
            start = sum(5 // P + (1 if r < 5 % P else 0) for r in range(R))
            assert got.shape == (mine, 4) and close(got[:, 0], stack[:, start:start + mine].sum(0), dtype)
            checked += 1
    # async handles: several in flight, polled, then synchronized (fused on the device)
    hs = [hvd.allreduce_async_(torch.full((100 + i,), float(R + i), device=dev), op=hvd.Average, name=f"async.{i}")
          for i in range(16)]
    while not all(hvd.poll(h) for h in hs):
        pass
    for i, h in enumerate(hs):
        assert torch.allclose(hvd.synchronize(h).cpu(), torch.full((100 + i,), (P - 1) / 2 + i))
        checked += 1
    hvd.barrier()
    return checked


def optimizer_step(dev, P, R):
    """One DistributedOptimizer step on P ranks (each half of a batch) equals one process."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(dev)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(dev)
    ref.load_state_dict(model.state_dict())
    x = torch.randn(8 * P, 8, generator=torch.Generator().manual_seed(1)).to(dev)
    y = torch.randn(8 * P, 1, generator=torch.Generator().manual_seed(2)).to(dev)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    mine = slice(8 * R, 8 * (R + 1))
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
    opt.step()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(ref(x), y).backward()
    ref_opt.step()
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(a, b, atol=1e-5), name
    return len(list(ref.parameters()))


def main():
    hvd.init()
    P, R = hvd.size(), hvd.rank()
    pin = os.environ.get("TORCH_GPU_PIN")
    index = int(pin) if pin is not None else hvd.local_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)
    dev = torch.device("cuda", index)
    checked = ops(dev, P, R) if sys.argv[1] == "ops" else optimizer_step(dev, P, R)
    path, why = engine.cuda_path()
    report({"ok": True, "checked": checked, "path": path, "why": why, "nccl_built": hvd.nccl_built(),
            "device": index})
    hvd.shutdown()


if __name__ == "__main__":
    main()
