"""The out-of-place collectives of ``appliance.torch``, differentiable as in Horovod.

Each public function here wraps one ``torch.autograd.Function`` whose forward runs the
asynchronous op from ``mpi_ops`` and waits for it (called alone when there is no graph to
record, see ``_run``), and whose backward is Horovod's:

* allreduce: the gradient is allreduced with the same op and scale factors;
* allgather: the gradient is averaged over ranks and this rank's rows are kept;
* broadcast: the gradient is averaged over ranks and kept on the root only (zero elsewhere);
* alltoall: the gradient travels back with the received splits;
* reducescatter: the gradient (times size for Sum, times the scale factors) is allgathered.

``HorovodAllreduce``... are the same Functions under Horovod's names, taking Horovod's ``apply``
arguments (``horovod.torch.mpi_ops`` exports them).

Owns nothing; reads no environment. Failure modes are those of ``mpi_ops``. Backward passes
use automatic names, so every rank must run its backward passes in the same order (as in
Horovod).
"""
from __future__ import annotations

import torch

from appliance.runtime import process_sets as _ps
from appliance.torch import mpi_ops as _ops
from appliance.torch.compression import Compression


class _NoGraph:
    """The ``ctx`` of a Function's forward run outside autograd (see ``_run``): it only holds
    attributes, which nobody reads."""

    def mark_non_differentiable(self, *tensors) -> None:
        pass


def _run(fn, tensors, *args):
    """``fn.apply(*args)``, or, when no graph can be recorded (grad mode off, or none of
    ``tensors`` requires grad), ``fn.forward`` alone: the same outputs, without the cost of
    ``Function.apply`` (about a quarter of a 4 KiB op's time on one rank; most calls, such as
    a metric's average, need no graph)."""
    if torch.is_grad_enabled():
        for t in tensors:
            if t.requires_grad:
                return fn.apply(*args)
    return fn.forward(_NoGraph(), *args)


def _rows_offset(rows: int, ps) -> int:
    """The offset of this rank's ``rows`` in a concatenation over the set's ranks (one small allgather)."""
    counts = _ops.synchronize(_ops.allgather_async(torch.tensor([rows], dtype=torch.int64), process_set=ps))
    return int(counts[: _ps.rank_in(ps)].sum().item())


# --- allreduce ---------------------------------------------------------------------------
class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, ps):
        ctx.args = (op, prescale_factor, postscale_factor, ps)
        return _ops.synchronize(_ops.allreduce_async(tensor, name=name, op=op, prescale_factor=prescale_factor,
                                                     postscale_factor=postscale_factor, process_set=ps))

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, ps = ctx.args
        return allreduce(grad, op=op, prescale_factor=pre, postscale_factor=post, process_set=ps), None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=_ops.global_process_set):
    """Reduce ``tensor`` over the ranks of ``process_set`` (default op Average) into a new tensor;
    the input is not modified. Differentiable."""
    op = _ops.resolve_op(op, average)  # process_set: checked where the request is made (mpi_ops)
    compressed, cctx = compression.compress(tensor)
    out = _run(_Allreduce, (compressed,), compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, cctx)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, ps, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, ps)
        return tuple(_ops.synchronize(_ops.grouped_allreduce_async(
            list(tensors), name=name, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
            process_set=ps)))

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, ps = ctx.args
        return (None, None, None, None, None,
                *grouped_allreduce(list(grads), op=op, prescale_factor=pre, postscale_factor=post, process_set=ps))


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=_ops.global_process_set):
    """Reduce a list of tensors as one group; returns a list of new tensors. Differentiable."""
    op = _ops.resolve_op(op, average)
    _ops.check_process_set(process_set)
    tensors = list(tensors)
    if not tensors:
        return []
    pairs = [compression.compress(t) for t in tensors]
    works = [p[0] for p in pairs]
    outs = _run(_GroupedAllreduce, works, name, op, prescale_factor, postscale_factor, process_set, *works)
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


# --- allgather ---------------------------------------------------------------------------
class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, ps):
        ctx.rows = int(tensor.shape[0]) if tensor.dim() else 0
        ctx.ps = ps
        return _ops.synchronize(_ops.allgather_async(tensor, name=name, process_set=ps))

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, op=_ops.Average, process_set=ctx.ps)
        return reduced.narrow(0, _rows_offset(ctx.rows, ctx.ps), ctx.rows), None, None


def allgather(tensor, name=None, process_set=_ops.global_process_set):
    """Concatenate the ``tensor`` of every rank of ``process_set`` along the first dimension (which
    may differ per rank) into a new tensor. Differentiable."""
    _ops.check_process_set(process_set)
    return _run(_Allgather, (tensor,), tensor, name, process_set)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, ps, *tensors):
        ctx.rows = [int(t.shape[0]) if t.dim() else 0 for t in tensors]
        ctx.ps = ps
        return tuple(_ops.synchronize(_ops.grouped_allgather_async(list(tensors), name=name, process_set=ps)))

    @staticmethod
    def backward(ctx, *grads):
        ps = ctx.ps
        reduced = grouped_allreduce(list(grads), op=_ops.Average, process_set=ps)
        counts = _ops.synchronize(_ops.allgather_async(torch.tensor([ctx.rows], dtype=torch.int64), process_set=ps))
        offsets = counts[: _ps.rank_in(ps)].sum(dim=0).tolist()
        return (None, None, *[g.narrow(0, int(off), rows) for g, off, rows in zip(reduced, offsets, ctx.rows)])


def grouped_allgather(tensors, name=None, process_set=_ops.global_process_set):
    """``allgather`` of each tensor of a list; returns a list. Differentiable."""
    _ops.check_process_set(process_set)
    tensors = list(tensors)
    if not tensors:
        return []
    return list(_run(_GroupedAllgather, tensors, name, process_set, *tensors))


# --- broadcast ---------------------------------------------------------------------------
class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, ps):
        ctx.root_rank = root_rank
        ctx.ps = ps
        return _ops.synchronize(_ops.broadcast_async(tensor, root_rank, name=name, process_set=ps))

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, op=_ops.Average, process_set=ctx.ps)
        if _ops.rank() != ctx.root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=_ops.global_process_set):
    """Root's ``tensor`` (``root_rank``: a job rank in ``process_set``) on every rank of the set, as a
    new tensor; the input is not modified. Differentiable."""
    _ops.check_process_set(process_set)
    return _run(_Broadcast, (tensor,), tensor, root_rank, name, process_set)


# --- alltoall ----------------------------------------------------------------------------
class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, ps):
        out, received = _ops.synchronize(_ops.alltoall_async(tensor, splits, name=name, process_set=ps))
        ctx.received = received
        ctx.ps = ps
        if splits is None:
            return out
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, *unused):
        back, _ = _ops.synchronize(_ops.alltoall_async(grad, ctx.received, process_set=ctx.ps))
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=_ops.global_process_set):
    """Scatter rows of ``tensor`` to the ranks of ``process_set`` (``splits[p]`` rows to its p-th
    rank; equal parts without ``splits``) and gather what they send. Returns the received tensor,
    and with ``splits`` also the rows received from each rank (as Horovod). Differentiable."""
    _ops.check_process_set(process_set)
    return _run(_Alltoall, (tensor,), tensor, splits, name, process_set)


# --- reducescatter -------------------------------------------------------------------------
def _reducescatter_grad(grad, op, pre, post, ps):
    scale = (_ps.size_of(ps) if op == _ops.Sum else 1) * pre * post
    return grad * scale if scale != 1 else grad


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, ps):
        ctx.args = (op, prescale_factor, postscale_factor, ps)
        return _ops.synchronize(_ops.reducescatter_async(tensor, name=name, op=op, prescale_factor=prescale_factor,
                                                         postscale_factor=postscale_factor, process_set=ps))

    @staticmethod
    def backward(ctx, grad):
        ps = ctx.args[-1]
        return allgather(_reducescatter_grad(grad, *ctx.args), process_set=ps), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=_ops.Average,
                  process_set=_ops.global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over the ranks of ``process_set`` and return this rank's block of the first
    dimension (the set's r-th rank: ``dim0 // size`` rows, one more when ``r < dim0 % size``).
    Differentiable."""
    _ops.check_process_set(process_set)
    compressed, cctx = compression.compress(tensor)
    out = _run(_Reducescatter, (compressed,), compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, cctx)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, ps, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, ps)
        return tuple(_ops.synchronize(_ops.grouped_reducescatter_async(
            list(tensors), name=name, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
            process_set=ps)))

    @staticmethod
    def backward(ctx, *grads):
        ps = ctx.args[-1]
        return (None, None, None, None, None,
                *grouped_allgather([_reducescatter_grad(g, *ctx.args) for g in grads], process_set=ps))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=_ops.Average,
                          process_set=_ops.global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """``reducescatter`` of each tensor of a list; returns a list. Differentiable."""
    _ops.check_process_set(process_set)
    tensors = list(tensors)
    if not tensors:
        return []
    pairs = [compression.compress(t) for t in tensors]
    works = [p[0] for p in pairs]
    outs = _run(_GroupedReducescatter, works, name, op, prescale_factor, postscale_factor, process_set, *works)
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


# --- Horovod's autograd Function classes -----------------------------------------------------
# ``horovod.torch.mpi_ops.HorovodAllreduce``... with Horovod's ``apply`` arguments (``average``,
# ``process_set``); each checks the process set, then runs the Function above on the same ctx.
class HorovodAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        _ops.check_process_set(process_set)
        return _Allreduce.forward(ctx, tensor, name, _ops.resolve_op(op, average), prescale_factor,
                                  postscale_factor, process_set)

    @staticmethod
    def backward(ctx, grad):
        return (_Allreduce.backward(ctx, grad)[0],) + (None,) * 6


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        _ops.check_process_set(process_set)
        return _GroupedAllreduce.forward(ctx, name, _ops.resolve_op(op, average), prescale_factor,
                                         postscale_factor, process_set, *tensors)

    @staticmethod
    def backward(ctx, *grads):
        return (None,) + _GroupedAllreduce.backward(ctx, *grads)


class HorovodAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        _ops.check_process_set(process_set)
        return _Allgather.forward(ctx, tensor, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        return _Allgather.backward(ctx, grad)


class HorovodGroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        _ops.check_process_set(process_set)
        return _GroupedAllgather.forward(ctx, name, process_set, *tensors)

    @staticmethod
    def backward(ctx, *grads):
        return tuple(_GroupedAllgather.backward(ctx, *grads))


class HorovodBroadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        _ops.check_process_set(process_set)
        return _Broadcast.forward(ctx, tensor, root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        return _Broadcast.backward(ctx, grad)


class HorovodAlltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        _ops.check_process_set(process_set)
        return _Alltoall.forward(ctx, tensor, splits, name, process_set)

    @staticmethod
    def backward(ctx, grad, *unused):
        return _Alltoall.backward(ctx, grad, *unused)


class HorovodReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        _ops.check_process_set(process_set)
        return _Reducescatter.forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set)

    @staticmethod
    def backward(ctx, grad):
        return (_Reducescatter.backward(ctx, grad)[0],) + (None,) * 5


class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        _ops.check_process_set(process_set)
        return _GroupedReducescatter.forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors)

    @staticmethod
    def backward(ctx, *grads):
        return tuple(_GroupedReducescatter.backward(ctx, *grads))
