"""``horovod.torch.sync_batch_norm``: batch normalisation whose statistics span every rank.

What it is: ``SyncBatchNorm``, a ``torch.nn.modules.batchnorm._BatchNorm`` with Horovod's
semantics. In training (or without running statistics) on more than one rank, each rank computes
per-channel ``(count, mean, sum of squared deviations)`` of its own batch, one allgather brings
every rank's triple to every rank, and the global mean and biased variance are combined from them
(Chan's parallel formula, so ranks may have different batch sizes, even zero). The input is
normalised with the global statistics; the running mean and variance are updated with the global
mean and the *unbiased* global variance, as ``torch.nn.BatchNorm`` on the concatenated batch would.
Backward is an ``autograd.Function``: the two per-channel sums the input gradient needs
(``sum(dy)``, ``sum(dy * (x - mean))``) are allreduced (Sum); the weight and bias gradients are
this rank's own shares (as in Horovod and torch: ``DistributedOptimizer`` reduces them). In eval
mode with running statistics, and on a single rank, it is ``torch.nn.functional.batch_norm``.
The maths is written in plain torch ops (statistics in float32 at least, float64 for float64
input), so CPU and CUDA tensors both work; double backward is not supported.

Collectives are named ``sync_batch_norm.stats`` and ``sync_batch_norm.grads`` (every layer
reuses them one after the other, as Horovod's names are reused), so two ``SyncBatchNorm``
forwards must not run concurrently in different threads. ``process_set=`` is passed to the
collectives (only the global set is accepted until process sets land).

Owns nothing; reads no environment. Failure modes: ``ValueError`` for input with fewer than 2
dimensions or a channel count other than ``num_features``, and when the whole job's batch holds
only one value per channel in training; the collectives' ``HorovodInternalError`` (a lost rank)
and ``MismatchError`` (ranks with different ``num_features`` or dtype on the same layer).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from appliance.torch.mpi_ops import (
    Sum, allgather_async, allreduce_async, global_process_set, size, synchronize,
)

_STATS_NAME = "sync_batch_norm.stats"
_GRADS_NAME = "sync_batch_norm.grads"


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _channel_shape(x: torch.Tensor):
    """Shape that broadcasts a per-channel vector against ``x`` (N, C, *)."""
    return (1, -1) + (1,) * (x.dim() - 2)


def _reduce_dims(x: torch.Tensor):
    return [0] + list(range(2, x.dim()))


def _group_size(process_set) -> int:
    if process_set is None or process_set is global_process_set:
        return size()
    return process_set.size()


class SyncBatchNorm(_BatchNorm):
    """Horovod's synchronous batch normalisation over (N, C, *) input of any spatial rank.

    Arguments as ``torch.nn.BatchNorm*d`` (``momentum=None``: cumulative average), plus
    ``process_set`` (keyword; the ranks whose batches are normalised together).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 device=None, dtype=None, *, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")
        if input.shape[1] != self.num_features:
            raise ValueError(f"expected {self.num_features} channels in dimension 1, got input of shape "
                             f"{tuple(input.shape)}")

    def _factor(self) -> float:
        """The running-statistics update factor of this step (0.0 when none is tracked)."""
        if not (self.training and self.track_running_stats):
            return 0.0
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return float(self.momentum)

    def forward(self, input):
        self._check_input_dim(input)
        factor = self._factor()
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats or _group_size(self.process_set) == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                use_batch_stats, factor, self.eps)
        running = self.track_running_stats and self.training
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, self.running_mean if running else None,
            self.running_var if running else None, self.eps, factor, self.process_set)


def _local_moments(x: torch.Tensor, sdt: torch.dtype) -> torch.Tensor:
    """This rank's per-channel ``[count, mean..., M2...]`` (length 2C+1) in ``sdt``."""
    c = x.shape[1]
    n = x.numel() // c if c else 0
    xs = x.to(sdt)
    if n:
        dims = _reduce_dims(x)
        mean = xs.mean(dim=dims)
        m2 = (xs - mean.view(_channel_shape(x))).square().sum(dim=dims)
    else:
        mean = torch.zeros(c, dtype=sdt, device=x.device)
        m2 = torch.zeros(c, dtype=sdt, device=x.device)
    return torch.cat([torch.tensor([float(n)], dtype=sdt, device=x.device), mean, m2])


def _combine(gathered: torch.Tensor, c: int):
    """Global (count, mean, M2) from every rank's ``[count, mean, M2]`` rows (Chan et al.)."""
    counts = gathered[:, 0]
    means = gathered[:, 1:1 + c]
    m2s = gathered[:, 1 + c:]
    total = counts.sum()
    if total <= 0:
        raise ValueError("SyncBatchNorm: every rank's batch is empty")
    weights = (counts / total).unsqueeze(1)
    mean = (weights * means).sum(0)
    m2 = (m2s + counts.unsqueeze(1) * (means - mean).square()).sum(0)
    return float(total.item()), mean, m2


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, factor, process_set):
        x = x.contiguous()
        c = x.shape[1]
        sdt = _stat_dtype(x.dtype)
        handle = allgather_async(_local_moments(x, sdt).unsqueeze(0), name=_STATS_NAME, process_set=process_set)
        total, mean, m2 = _combine(synchronize(handle), c)
        if total <= 1:
            raise ValueError(f"SyncBatchNorm: expected more than 1 value per channel when training over all "
                             f"ranks, got input of shape {tuple(x.shape)} and {int(total)} in all")
        invstd = torch.rsqrt(m2 / total + eps)
        if running_mean is not None:
            running_mean.mul_(1.0 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
        if running_var is not None:
            running_var.mul_(1.0 - factor).add_((m2 / (total - 1)).to(running_var.dtype), alpha=factor)
        shape = _channel_shape(x)
        xhat = (x.to(sdt) - mean.view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.to(sdt).view(shape)
        if bias is not None:
            y = y + bias.to(sdt).view(shape)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.total = total
        ctx.process_set = process_set
        return y.to(x.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        x, weight, mean, invstd = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad[0:3]
        sdt = mean.dtype
        shape = _channel_shape(x)
        dims = _reduce_dims(x)
        dy = grad_output.contiguous().to(sdt)
        xmu = x.to(sdt) - mean.view(shape)
        sum_dy = dy.sum(dim=dims)
        sum_dy_xmu = (dy * xmu).sum(dim=dims)
        grad_input = grad_weight = grad_bias = None
        if need_weight and weight is not None:
            grad_weight = (sum_dy_xmu * invstd).to(weight.dtype)
        if need_bias:
            grad_bias = sum_dy.to(grad_output.dtype if weight is None else weight.dtype)
        if need_input:
            c = x.shape[1]
            packed = torch.cat([sum_dy, sum_dy_xmu])
            packed = synchronize(allreduce_async(packed, op=Sum, name=_GRADS_NAME, process_set=ctx.process_set))
            g_sum_dy, g_sum_dy_xmu = packed[:c], packed[c:]
            n = ctx.total
            scale = invstd if weight is None else invstd * weight.to(sdt)
            grad = (dy - (g_sum_dy / n).view(shape)
                    - xmu * (invstd.square() * g_sum_dy_xmu / n).view(shape)) * scale.view(shape)
            grad_input = grad.to(x.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


__all__ = ["SyncBatchNorm"]
