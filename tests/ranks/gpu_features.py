"""Worker for tests/torch/test_cuda_tensors.py (gpu tier): Horovod features on CUDA tensors
(process sets, Adasum, SyncBatchNorm, join), checked against the same computation on CPU tensors
in this process.

Every rank uses cuda:(local_rank % device_count). Reports what it checked and the CUDA path of
the global set.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _report import report  # noqa: E402

import appliance.torch as hvd  # noqa: E402
from appliance.runtime import engine  # noqa: E402


def main():
    hvd.init(process_sets="dynamic")
    r, n = hvd.rank(), hvd.size()
    dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    checked = []
    # the global set first (NCCL where it can), then a set of the even ranks (host staging)
    g = hvd.allreduce(torch.full((1000,), float(r + 1), device=dev), op=hvd.Sum, name="global")
    assert g.device == dev and torch.equal(g.cpu(), torch.full((1000,), n * (n + 1) / 2))
    if n > 1:
        evens = hvd.add_process_set(list(range(0, n, 2)))
    else:  # at one rank the evens are every rank: refused as a duplicate of the global set, as in Horovod
        try:
            hvd.add_process_set([0])
        except ValueError as e:
            assert "the global process set" in str(e), e
        else:
            raise AssertionError("a set of every rank was added beside the global set")
        evens = hvd.global_process_set
    if evens.included():
        members = evens.ranks
        s = hvd.allreduce(torch.full((513,), float(r + 1), device=dev), op=hvd.Sum, process_set=evens)
        assert s.device == dev and torch.equal(s.cpu(), torch.full((513,), float(sum(m + 1 for m in members))))
        ag = hvd.allgather(torch.full((r + 1, 3), float(r), device=dev), process_set=evens)
        assert ag.device == dev and ag[:, 0].cpu().tolist() == [float(m) for m in members for _ in range(m + 1)]
        b = hvd.broadcast(torch.full((7,), float(r), device=dev), members[-1], process_set=evens)
        assert torch.equal(b.cpu(), torch.full((7,), float(members[-1])))
        checked.append("process_set")
    hvd.remove_process_set(evens)
    # Adasum: equal vectors give the vector; orthogonal ones add up
    a = hvd.allreduce(torch.full((64,), 3.0, device=dev), op=hvd.Adasum, name="adasum.eq")
    assert torch.allclose(a.cpu(), torch.full((64,), 3.0))
    e = torch.zeros(n * 4, device=dev)
    e[r * 4:(r + 1) * 4] = 1.0
    o = hvd.allreduce(e, op=hvd.Adasum, name="adasum.orth")
    assert torch.allclose(o.cpu(), torch.ones(n * 4)), o
    checked.append("adasum")
    # SyncBatchNorm on CUDA: the output of this rank's slice equals BatchNorm on the global batch
    torch.manual_seed(0)
    xs = [torch.randn(r_ + 2, 5, 4, dtype=torch.float64) for r_ in range(n)]
    sbn = hvd.SyncBatchNorm(5, momentum=1.0).double().to(dev)
    ref = torch.nn.BatchNorm1d(5, momentum=1.0).double()
    x = xs[r].to(dev).requires_grad_()
    y = sbn(x)
    full = torch.cat(xs).requires_grad_()
    want = ref(full)
    start = sum(q + 2 for q in range(r))
    assert torch.allclose(y.cpu(), want[start:start + r + 2].detach(), atol=1e-9)
    assert torch.allclose(sbn.running_var.cpu(), ref.running_var, atol=1e-9)
    w = torch.randn(full.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (y * w[start:start + r + 2].to(dev)).sum().backward()
    (want * w).sum().backward()
    assert torch.allclose(x.grad.cpu(), full.grad[start:start + r + 2], atol=1e-9)
    checked.append("sync_batch_norm")
    # join with a CUDA allreduce: the joined rank contributes zeros on its device
    if n > 1:
        if r == 0:
            last = hvd.join(dev.index)
        else:
            j = hvd.allreduce(torch.ones(5, device=dev), op=hvd.Sum, name="joined")
            assert torch.equal(j.cpu(), torch.full((5,), float(n - 1)))
            last = hvd.join(dev.index)
        assert last != 0
        checked.append("join")
    report({"ok": True, "rank": r, "checked": checked, "path": engine.cuda_path()[0]})
    hvd.shutdown()


if __name__ == "__main__":
    main()
