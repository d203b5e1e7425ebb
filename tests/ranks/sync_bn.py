"""Worker for tests/torch/test_sync_batch_norm.py: ``hvd.SyncBatchNorm`` against
``torch.nn.BatchNorm`` on the whole job's batch.

Usage: sync_bn.py (run by the launcher on N ranks, or alone as one rank). Rank r's batch has
``r + 1`` samples in most cases (``r + 2`` or ``r`` in some, so rank 0's may be empty; a lone rank
gets more than one) and every input is reproducible from (case, rank), so each rank builds the
concatenated global batch and runs a ``torch.nn.BatchNorm{1,2,3}d`` (or a whole reference model)
on it. Checked per case, in float64 and float32: this rank's slice of the output and of the
input gradient, the running mean and variance, ``num_batches_tracked``, and the weight and bias
gradients summed over ranks (each rank's share is its own, as in Horovod). Also: eval mode
(running statistics, no collective), ``track_running_stats=False`` in eval (batch statistics
over all ranks), ``momentum=None``, two layers of different widths in one model (the collective
names are reused), and a ``DistributedOptimizer`` training step. Reports
``{"ok", "rank", "size", "cases"}`` via ``_report``.
"""
import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import appliance.torch as hvd  # noqa: E402
from _report import report  # noqa: E402

TOL = {torch.float64: 1e-10, torch.float32: 2e-5}


def gen(case: str, r: int) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(f"{case}/{r}".encode()))


def close(got, want, what, dtype):
    t = TOL[dtype]
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if not torch.allclose(got.double(), want.double(), rtol=t, atol=t):
        raise AssertionError(f"{what}: max abs diff {(got.double() - want.double()).abs().max().item():.3g}")


def rows(P, extra):
    """Each rank's batch size; a lone rank gets a batch with more than one row."""
    return [r + extra for r in range(P)] if P > 1 else [extra + 3]


def inputs(case, P, spatial, C, dtype, extra=1):
    """Every rank's input and output-gradient, and where this rank's rows start."""
    xs, gs = [], []
    for r, n in enumerate(rows(P, extra)):
        g = gen(case, r)
        xs.append((torch.randn((n, C) + spatial, generator=g, dtype=torch.float64) * (r + 1) + r).to(dtype))
        gs.append(torch.randn((n, C) + spatial, generator=g, dtype=torch.float64).to(dtype))
    return xs, gs


REF = {0: torch.nn.BatchNorm1d, 1: torch.nn.BatchNorm1d, 2: torch.nn.BatchNorm2d, 3: torch.nn.BatchNorm3d}


def compare_layer(case, spatial, dtype, momentum=0.1, affine=True, steps=2, extra=1):
    P, r = hvd.size(), hvd.rank()
    C = 3
    sync = hvd.SyncBatchNorm(C, momentum=momentum, affine=affine).to(dtype)
    ref = REF[len(spatial)](C, momentum=momentum, affine=affine).to(dtype)
    if affine:
        with torch.no_grad():
            w = torch.randn(C, generator=gen(case + "/w", 0), dtype=torch.float64).to(dtype)
            b = torch.randn(C, generator=gen(case + "/b", 0), dtype=torch.float64).to(dtype)
            for m in (sync, ref):
                m.weight.copy_(w)
                m.bias.copy_(b)
    start = sum(rows(P, extra)[:r])
    for step in range(steps):
        xs, gs = inputs(f"{case}/{step}", P, spatial, C, dtype, extra)
        x = xs[r].clone().requires_grad_(True)
        y = sync(x)
        y.backward(gs[r])
        xg = torch.cat(xs).requires_grad_(True)
        yg = ref(xg)
        yg.backward(torch.cat(gs))
        n = xs[r].shape[0]
        what = f"{case} {dtype} step {step}"
        close(y.detach(), yg.detach()[start:start + n], f"{what}: output", dtype)
        close(x.grad, xg.grad[start:start + n], f"{what}: input grad", dtype)
        close(sync.running_mean, ref.running_mean, f"{what}: running_mean", dtype)
        close(sync.running_var, ref.running_var, f"{what}: running_var", dtype)
        assert int(sync.num_batches_tracked) == int(ref.num_batches_tracked) == step + 1, what
        if affine:
            close(hvd.allreduce(sync.weight.grad, op=hvd.Sum, name=f"{what}.wg"), ref.weight.grad,
                  f"{what}: weight grad (sum over ranks)", dtype)
            close(hvd.allreduce(sync.bias.grad, op=hvd.Sum, name=f"{what}.bg"), ref.bias.grad,
                  f"{what}: bias grad (sum over ranks)", dtype)
            for m in (sync, ref):
                m.weight.grad = None
                m.bias.grad = None
    # eval: the running statistics, this rank's input only
    sync.eval()
    ref.eval()
    xs, _ = inputs(f"{case}/eval", P, spatial, C, dtype, extra)
    with torch.no_grad():
        close(sync(xs[r]), ref(xs[r]), f"{case} {dtype}: eval output", dtype)


def train_shapes():
    for dtype in (torch.float64, torch.float32):
        for spatial in ((), (4,), (2, 3), (2, 2, 3)):
            compare_layer(f"shape{len(spatial)}", spatial, dtype)
    compare_layer("empty_rank0", (4,), torch.float64, extra=0)  # rank 0's batch is empty
    compare_layer("wider", (5,), torch.float64, extra=2)


def options():
    compare_layer("cumulative", (4,), torch.float64, momentum=None, steps=3)
    compare_layer("no_affine", (2, 3), torch.float64, affine=False)


def no_running_stats():
    """track_running_stats=False: batch statistics over all ranks in eval too, no running buffers."""
    P, r = hvd.size(), hvd.rank()
    sync = hvd.SyncBatchNorm(3, track_running_stats=False).double().eval()
    ref = torch.nn.BatchNorm1d(3, track_running_stats=False).double().eval()
    assert sync.running_mean is None
    xs, _ = inputs("nostats", P, (4,), 3, torch.float64)
    start = sum(rows(P, 1)[:r])
    with torch.no_grad():
        close(sync(xs[r]), ref(torch.cat(xs))[start:start + xs[r].shape[0]], "nostats eval", torch.float64)


def two_layers():
    """Two SyncBatchNorm layers of different widths in one model (names reused with new shapes),
    forward and backward against the same model with torch.nn.BatchNorm1d on the global batch."""
    P, r = hvd.size(), hvd.rank()

    def model(bn):
        torch.manual_seed(7)
        return torch.nn.Sequential(bn(3), torch.nn.Conv1d(3, 5, 3), bn(5), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.Linear(5 * 4, 2)).double()
    sync, ref = model(hvd.SyncBatchNorm), model(torch.nn.BatchNorm1d)
    xs, _ = inputs("two_layers", P, (6,), 3, torch.float64)
    start, n = sum(rows(P, 1)[:r]), xs[r].shape[0]
    x = xs[r].clone().requires_grad_(True)
    y = sync(x)
    y.square().sum().backward()
    xg = torch.cat(xs).requires_grad_(True)
    yg = ref(xg)
    yg.square().sum().backward()
    close(y.detach(), yg.detach()[start:start + n], "two_layers output", torch.float64)
    close(x.grad, xg.grad[start:start + n], "two_layers input grad", torch.float64)
    for (name, p), q in zip(sync.named_parameters(), ref.parameters()):
        close(hvd.allreduce(p.grad, op=hvd.Sum, name=f"two_layers.{name}"), q.grad, f"two_layers {name} grad",
              torch.float64)
    for i in (0, 2):
        close(sync[i].running_var, ref[i].running_var, f"two_layers bn{i} running_var", torch.float64)


def optimizer_step():
    """One DistributedOptimizer(op=Sum) step through SyncBatchNorm equals one SGD step of the
    reference on the global batch (loss = sum over every rank's rows)."""
    P, r = hvd.size(), hvd.rank()

    def model(bn):
        torch.manual_seed(11)
        return torch.nn.Sequential(torch.nn.Linear(4, 3), bn(3), torch.nn.Tanh(), torch.nn.Linear(3, 1)).double()
    sync, ref = model(hvd.SyncBatchNorm), model(torch.nn.BatchNorm1d)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(sync.parameters(), lr=0.1), named_parameters=sync.named_parameters(),
                                   op=hvd.Sum)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    xs, _ = inputs("opt", P, (), 4, torch.float64)
    opt.zero_grad()
    sync(xs[r]).square().sum().backward()
    opt.step()
    ref_opt.zero_grad()
    ref(torch.cat(xs)).square().sum().backward()
    ref_opt.step()
    for (name, p), q in zip(sync.named_parameters(), ref.parameters()):
        close(p.detach(), q.detach(), f"after one step: {name}", torch.float64)


def errors():
    bn = hvd.SyncBatchNorm(3)
    for bad in (torch.zeros(3), torch.zeros(2, 4)):
        try:
            bn(bad)
        except ValueError:
            continue
        raise AssertionError(f"input of shape {tuple(bad.shape)} was accepted")


CASES = {"train_shapes": train_shapes, "options": options, "no_running_stats": no_running_stats,
         "two_layers": two_layers, "optimizer_step": optimizer_step, "errors": errors}


def main() -> None:
    torch.set_num_threads(1)
    hvd.init()
    data = {"ok": False, "rank": hvd.rank(), "size": hvd.size(), "cases": []}
    try:
        for name, fn in CASES.items():
            fn()
            data["cases"].append(name)
        data["ok"] = True
    finally:
        report(data)
        hvd.shutdown()


if __name__ == "__main__":
    main()
