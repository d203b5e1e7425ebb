"""Worker body: gradients of the out-of-place collectives, against Horovod's backward rules."""
from __future__ import annotations

import torch

from _torch_common import block, check, data, ref_reduce


def _grad_out(case, p, shape, dt):
    """Rank p's incoming gradient: differs per rank, so averaging vs summing is visible."""
    return data(f"g/{case}", p, shape, dt) + (p + 1)


def autograd(hvd):
    P, r = hvd.size(), hvd.rank()
    for dt in (torch.float32, torch.float64):
        for shape in ((5,), (4, 3), (2, 3, 2)):
            # allreduce: the gradient is allreduced with the same op and scale factors
            for op, pre, post in ((hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Average, 0.5, 4.0)):
                case = f"ar/{dt}/{shape}/{op}/{pre}"
                x = data(case, r, shape, dt).requires_grad_()
                gs = [_grad_out(case, p, shape, dt) for p in range(P)]
                hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post).backward(gs[r])
                check(x.grad, ref_reduce(gs, op, hvd, pre, post), f"allreduce grad {case}", exact=False)
            # grouped_allreduce
            case = f"gar/{dt}/{shape}"
            xs = [data(f"{case}/{i}", r, shape, dt).requires_grad_() for i in range(2)]
            gs = [[_grad_out(f"{case}/{i}", p, shape, dt) for p in range(P)] for i in range(2)]
            outs = hvd.grouped_allreduce(xs, op=hvd.Sum)
            torch.autograd.backward(outs, [g[r] for g in gs])
            for i in range(2):
                check(xs[i].grad, ref_reduce(gs[i], hvd.Sum, hvd), f"grouped_allreduce grad {case} [{i}]", False)
            # allgather: the gradient is averaged and this rank's rows kept
            rows = [p + 2 for p in range(P)]
            case = f"ag/{dt}/{shape}"
            x = data(case, r, (rows[r],) + shape[1:], dt).requires_grad_()
            gs = [_grad_out(case, p, (sum(rows),) + shape[1:], dt) for p in range(P)]
            hvd.allgather(x).backward(gs[r])
            off = sum(rows[:r])
            check(x.grad, (sum(gs) / P)[off:off + rows[r]], f"allgather grad {case}", exact=False)
            # grouped_allgather
            xs = [data(f"{case}/g{i}", r, (rows[r] + i,) + shape[1:], dt).requires_grad_() for i in range(2)]
            gs = [[_grad_out(f"{case}/g{i}", p, (sum(rows) + P * i,) + shape[1:], dt) for p in range(P)]
                  for i in range(2)]
            torch.autograd.backward(hvd.grouped_allgather(xs), [g[r] for g in gs])
            for i in range(2):
                off = sum(rows[:r]) + r * i
                check(xs[i].grad, (sum(gs[i]) / P)[off:off + rows[r] + i], f"grouped_allgather grad {case}", False)
            # broadcast: the averaged gradient on the root, zero elsewhere
            for root in range(P):
                case = f"bc/{dt}/{shape}/{root}"
                x = data(case, r, shape, dt).requires_grad_()
                gs = [_grad_out(case, p, shape, dt) for p in range(P)]
                hvd.broadcast(x, root).backward(gs[r])
                want = sum(gs) / P if r == root else torch.zeros(shape, dtype=dt)
                check(x.grad, want, f"broadcast grad {case}", exact=False)
            # alltoall: the gradient goes back where the rows came from
            table = [[(p + q) % 3 + 1 for q in range(P)] for p in range(P)]
            case = f"a2a/{dt}/{shape}"
            x = data(case, r, (sum(table[r]),) + shape[1:], dt).requires_grad_()
            recv = [sum(table[q][p] for q in range(P)) for p in range(P)]
            gs = [_grad_out(case, p, (recv[p],) + shape[1:], dt) for p in range(P)]
            out, splits = hvd.alltoall(x, splits=table[r])
            assert not splits.requires_grad
            out.backward(gs[r])
            want = torch.cat([gs[q][sum(table[s][q] for s in range(r)):][:table[r][q]] for q in range(P)])
            check(x.grad, want, f"alltoall grad {case}", exact=False)
            x.grad = None
            y = data(case, r, (2 * P,) + shape[1:], dt).requires_grad_()
            hvd.alltoall(y).backward(torch.ones(2 * P, *shape[1:], dtype=dt) * (r + 1))
            want = torch.cat([torch.full((2,) + shape[1:], float(q + 1), dtype=dt) for q in range(P)])
            check(y.grad, want, f"alltoall grad without splits {case}", exact=False)
            # reducescatter: allgather of the gradient, times size for Sum, times the scale factors
            d = 2 * P + 1
            for op, pre, post in ((hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Average, 0.5, 3.0)):
                case = f"rs/{dt}/{shape}/{op}/{pre}"
                x = data(case, r, (d,) + shape[1:], dt).requires_grad_()
                gs = [_grad_out(case, p, (block(d, p, P)[1],) + shape[1:], dt) for p in range(P)]
                hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post).backward(gs[r])
                factor = (P if op == hvd.Sum else 1) * pre * post
                check(x.grad, torch.cat(gs) * factor, f"reducescatter grad {case}", exact=False)
            xs = [data(f"grs/{dt}/{shape}/{i}", r, (d + i,) + shape[1:], dt).requires_grad_() for i in range(2)]
            outs = hvd.grouped_reducescatter(xs, op=hvd.Sum)
            gs = [[_grad_out(f"grs/{i}", p, (block(d + i, p, P)[1],) + shape[1:], dt) for p in range(P)]
                  for i in range(2)]
            torch.autograd.backward(outs, [g[r] for g in gs])
            for i in range(2):
                check(xs[i].grad, torch.cat(gs[i]) * P, f"grouped_reducescatter grad [{i}]", exact=False)
    # No graph to record (grad mode off, or no input requiring grad): the ops run their forward
    # alone, without Function.apply, and their outputs are plain tensors.
    from appliance.torch import _autograd
    applied = []
    real_apply = _autograd._Allreduce.apply
    _autograd._Allreduce.apply = lambda *a: applied.append(1) or real_apply(*a)
    try:
        x = torch.full((4,), float(r + 1), requires_grad=True)
        with torch.no_grad():
            outs = [hvd.allreduce(x, op=hvd.Sum), hvd.allgather(x), hvd.broadcast(x, 0), hvd.alltoall(x.repeat(P)),
                    hvd.reducescatter(x.repeat(P), op=hvd.Sum)]
        outs.append(hvd.allreduce(x.detach(), op=hvd.Sum))
        assert not applied, "an allreduce with no graph to record went through Function.apply"
        for out in outs:
            assert not out.requires_grad and out.grad_fn is None, f"no graph, yet {out} requires grad"
        check(outs[0], torch.full((4,), float(P * (P + 1) // 2)), "allreduce under no_grad")
        y = hvd.allreduce(x, op=hvd.Sum)
        assert applied and y.grad_fn is not None, "an allreduce of a tensor requiring grad must record its graph"
    finally:
        _autograd._Allreduce.apply = real_apply
    # fp16 compression: float32 in, float32 out, gradient flows through the casts
    x = torch.full((6,), 1.5, requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert y.dtype == torch.float32
    check(y, torch.full((6,), 1.5 * P), "fp16-compressed allreduce", exact=False)
    y.backward(torch.ones(6))
    check(x.grad, torch.full((6,), float(P)), "fp16-compressed allreduce grad", exact=False)
    ints = torch.arange(4, dtype=torch.int32)
    check(hvd.allreduce(ints, op=hvd.Sum, compression=hvd.Compression.fp16), ints * P, "fp16 leaves ints alone")


CASES = {"autograd": autograd}
