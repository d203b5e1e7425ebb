"""``DistributedOptimizer(op=hvd.Adasum)`` with more than one rank: Horovod's delta optimizer.

What it is: the class mixed in before the user's optimizer class when ``DistributedOptimizer``
is asked for Adasum (``appliance.torch.optimizer`` builds it). Adasum combines *model updates*,
not gradients, so each rank first steps its own optimizer, then the ranks combine what the
step changed:

  start = p; local step of p (p - lr f(g)); delta = p - start
  delta = Adasum over ranks (allreduce op=Adasum); p = start + delta

As in Horovod, the local step of a parameter runs inside its gradient hook as soon as backward
has accumulated its gradient ``backward_passes_per_step`` times (the wrapped optimizer steps
that one parameter: the other parameters are hidden from its ``param_groups`` for the call),
and the Adasum allreduce of its delta starts at once, overlapping the rest of backward.
``step()`` completes every delta (stepping and starting those whose hook did not fire) and
writes ``start + delta`` into the parameters. Between a hook and ``step()`` a parameter holds
its delta, not its value.

Owns: per parameter, the value before the local step (``_starting_models``), the handle map
and the accumulation counters. Reads no environment. Failure modes: ``AssertionError`` for
``zero_grad()`` between backward and step, for more backward passes than declared, and for
``skip_synchronize()`` (not meaningful for a delta optimizer, as in Horovod); the collectives'
errors from ``step()``. Adasum needs floating point parameters (``ValueError`` otherwise).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from appliance.runtime import metrics as _metrics
from appliance.torch.mpi_ops import Adasum, allreduce_async_, global_process_set, synchronize


class PendingReductionGuard:
    """Horovod's rule for both distributed optimizers: ``zero_grad()`` between backward and
    ``step()`` (reductions started by the gradient hooks still pending in ``self._handles``)
    raises AssertionError."""

    def zero_grad(self, set_to_none: bool = True):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                                 "cause a race condition.")
        return super().zero_grad(set_to_none)


class DistributedAdasumOptimizer(PendingReductionGuard, torch.optim.Optimizer):
    """Mixed in before the user's optimizer class by ``DistributedOptimizer(op=hvd.Adasum)``;
    ``param_names`` maps each parameter to its (unique) allreduce name."""

    def __init__(self, params, param_names: dict, compression, backward_passes_per_step=1,
                 process_set=global_process_set):
        super().__init__(params)
        self._compression = compression
        self._parameter_names = param_names
        self.backward_passes_per_step = backward_passes_per_step
        self.process_set = process_set
        self._allreduce_delay = {p: backward_passes_per_step for p in param_names}
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False) for p in param_names}
        self._handles = {}
        self._requires_update = set()
        self._hooks = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    def _make_hook(self, p):
        def hook(*ignore):
            if p in self._handles and self._allreduce_delay[p] <= 0:
                raise AssertionError("Gradients were computed more than backward_passes_per_step times before "
                                     "call to step(). Increase backward_passes_per_step to accumulate "
                                     "gradients locally.")
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                self._handles[p] = self._step_and_reduce_delta(p)
            else:
                self._handles[p] = (None, None)
        return hook

    def _step_one(self, p) -> None:
        """The wrapped optimizer's step, on ``p`` alone."""
        saved = [group["params"] for group in self.param_groups]
        try:
            for group in self.param_groups:
                group["params"] = [p] if any(v is p for v in group["params"]) else []
            super().step()
        finally:
            for group, params in zip(self.param_groups, saved):
                group["params"] = params

    def _step_and_reduce_delta(self, p):
        start = self._starting_models[p]
        start.copy_(p.data)
        self._step_one(p)
        p.data.sub_(start)  # p now holds this rank's delta
        compressed, ctx = self._compression.compress(p.data)
        handle = allreduce_async_(compressed, name=self._parameter_names.get(p), op=Adasum,
                                  process_set=self.process_set)
        return handle, ctx

    def synchronize(self):
        """Nothing to do: ``step()`` completes the deltas (as Horovod's Adasum optimizer)."""

    @contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")
        yield  # pragma: no cover

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for p in self._requires_update - set(self._handles):
            self._handles[p] = (None, None)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:  # step() before backward_passes_per_step passes (or no gradient)
                handle, ctx = self._step_and_reduce_delta(p)
            delta = self._compression.decompress(synchronize(handle), ctx)
            start = self._starting_models[p]
            start.add_(delta.to(start.dtype))
            p.data.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        _metrics.note_step("optimizer")
        return loss
