"""``DistributedOptimizer``: any ``torch.optim.Optimizer``, with gradients averaged over ranks.

As in Horovod, ``DistributedOptimizer(opt, ...)`` returns an instance of a class made on the
fly that derives from ``type(opt)`` (so ``isinstance(dopt, type(opt))`` holds and the wrapped
optimizer's own ``step`` does the update) and shares ``opt.param_groups``. With more than one
rank, or in an elastic job at any size, a hook on every parameter starts an in-place
``allreduce_async_`` of its gradient as soon as backward has accumulated it
``backward_passes_per_step`` times; ``synchronize()`` waits for them all (starting the ones whose
gradient never came, with zeros), and ``step()`` calls it unless inside ``skip_synchronize()``.
With ``op=hvd.Adasum`` (more than one rank, or elastic) it builds Horovod's delta optimizer
instead (``appliance.torch.adasum_optimizer``).

Elastic jobs (``HOROVOD_ELASTIC=1``, which the launcher gives every elastic worker, as
Horovod's does): an optimizer is built once, before ``hvd.elastic.run``, at whatever size the job
has then, and is kept across every later growth; so it registers its hooks even at size 1 (an
allreduce at one rank costs little), else a job started at one rank would step without
allreducing after it grew while its new ranks waited for those allreduces. For the same reason
Adasum picks the delta optimizer at size 1 too (every rank of a grown job runs one algorithm),
and ``groups`` take the order of this rank's ``param_groups`` instead of rank 0's by a broadcast
(a joining worker builds its optimizer while the others train: a collective there could never be
matched).

Owns the per-optimizer handle map and counters. Env vars: HOROVOD_ELASTIC. Failure modes: ``ValueError``
for bad arguments (duplicate or missing names, ``gradient_predivide_factor`` with an op other
than Average...), ``AssertionError`` for ``zero_grad()`` between backward and step or more
backward passes than declared (as Horovod), and the collectives' errors from ``synchronize``.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch

from appliance.common.knobs import read
from appliance.torch.adasum_optimizer import DistributedAdasumOptimizer, PendingReductionGuard
from appliance.torch.compression import Compression
from appliance.torch.functions import broadcast_object
from appliance.runtime import metrics as _metrics, process_sets as _ps
from appliance.torch.mpi_ops import (
    Adasum, Average, allreduce_async_, global_process_set, grouped_allreduce_async_, size,
    sparse_allreduce_async, synchronize_all,
)


def _split(items: list, n: int) -> list:
    """``items`` in ``n`` consecutive chunks whose sizes differ by at most one."""
    q, r = divmod(len(items), n)
    return [items[i * q + min(i, r):(i + 1) * q + min(i + 1, r)] for i in range(n)]


def _elastic() -> bool:
    """Whether this process is a worker of an elastic job (HOROVOD_ELASTIC, as Horovod reads it):
    its optimizers outlive the size they were built at."""
    return bool(read("HOROVOD_ELASTIC"))


def _parameter_names(param_groups, named_parameters) -> dict:
    """{parameter: allreduce name}, checked as Horovod does (tuples, unique names, every
    parameter named); without ``named_parameters``, ``allreduce.noname.<group>.<index>``."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [(f"allreduce.noname.{i}.{j}", v)
                            for i, group in enumerate(param_groups) for j, v in enumerate(group["params"])]
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually "
                         "produced by model.named_parameters().")
    seen, dups = set(), set()
    for k, _ in named_parameters:
        (dups if k in seen else seen).add(k)
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: "
                         + ", ".join(sorted(dups)))
    all_ids = {id(v) for group in param_groups for v in group["params"]}
    unnamed = all_ids - {id(v) for _, v in named_parameters}
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not "
                         "named. Python object ids: " + ", ".join(str(i) for i in sorted(unnamed)))
    return {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}


def local_step(optimizer) -> None:
    """One step of the optimizer on this rank alone: for a ``DistributedOptimizer``, the wrapped
    optimizer's own step (no allreduce); for any other, its ``step()``."""
    if isinstance(optimizer, _DistributedOptimizer):
        super(_DistributedOptimizer, optimizer).step()
    elif isinstance(optimizer, DistributedAdasumOptimizer):
        super(DistributedAdasumOptimizer, optimizer).step()
    else:
        optimizer.step()


class _DistributedOptimizer(PendingReductionGuard, torch.optim.Optimizer):
    """Mixed in before the user's optimizer class by ``DistributedOptimizer``."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1, op=Average,
                 gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False,
                 process_set=global_process_set):
        super().__init__(params)
        self._compression = compression
        self._parameter_names = _parameter_names(self.param_groups, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for v in self._parameter_names}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True

        if groups is not None:
            if not (isinstance(groups, list) or groups > 0):
                raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
            if isinstance(groups, list):
                grouped = set()
                for members in groups:
                    for p in members:
                        if not isinstance(p, torch.Tensor):
                            raise ValueError("groups must consist of torch.Tensor.")
                        if id(p) in grouped:
                            raise ValueError("A parameter can only appear once in groups.")
                        grouped.add(id(p))
        self._groups = groups
        self._p_to_group = {}
        self._group_counts = {}
        if self.process_set.included() is not False and (size() > 1 or _elastic()):
            self._register_hooks()

    # --- Horovod's public extras -------------------------------------------------------------
    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super().load_state_dict(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    # --- hooks ------------------------------------------------------------------------------
    def _register_hooks(self):
        if self._groups is not None:
            self._form_groups()
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    if hasattr(p, "register_post_accumulate_grad_hook"):
                        self._grad_accs.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))
                    else:  # older torch: hook the gradient accumulator node
                        acc = p.expand_as(p).grad_fn.next_functions[0][0]
                        acc.register_hook(self._make_hook(p))
                        self._grad_accs.append(acc)

    def _form_groups(self):
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        # Rank 0's parameter order decides the groups, so they are the same everywhere (elastic:
        # this rank's own order, as every worker runs the same script; module docstring).
        if not _elastic():
            root = self.process_set.ranks[0] if self.process_set.process_set_id else 0
            order = broadcast_object([self._parameter_names.get(p) for p in params], root_rank=root,
                                     process_set=self.process_set)
            params.sort(key=lambda p: order.index(self._parameter_names.get(p)))
        if isinstance(self._groups, list):
            wanted = {id(p) for p in params}
            p_groups, placed = [], set()
            for members in self._groups:
                p_groups.append([p for p in members if id(p) in wanted])
                placed.update(id(p) for p in p_groups[-1])
            p_groups += [[p] for p in params if id(p) not in placed]
        else:
            p_groups = _split(params, self._groups)
        for members in p_groups:
            members = tuple(members)
            for p in members:
                self._p_to_group[p] = members
            self._group_counts[members] = 0

    def _scale_factors(self):
        if self.op == Average:  # the core divides by size after the sum
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _allreduce_grad_async(self, p, name=None):
        tensor = p.grad
        if tensor is None:
            # Another rank may have a gradient for p (dynamic graphs): take part with zeros.
            tensor = p.grad = torch.zeros_like(p.data)
        if name is None:
            name = self._parameter_names.get(p)
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                return sparse_allreduce_async(tensor, name=name, op=self.op, process_set=self.process_set), None
            tensor = tensor.to_dense()
        compressed, ctx = self._compression.compress(tensor)
        pre, post = self._scale_factors()
        handle = allreduce_async_(compressed, name=name, op=self.op, prescale_factor=pre, postscale_factor=post,
                                  process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, ps):
        name = self._parameter_names.get(ps[0])
        compressed, ctxs = zip(*[self._compression.compress(p.grad) for p in ps])
        pre, post = self._scale_factors()
        handle = grouped_allreduce_async_(list(compressed), name=name, op=self.op, prescale_factor=pre,
                                          postscale_factor=post, process_set=self.process_set)
        return handle, ctxs

    def _make_hook(self, p):
        name = self._parameter_names.get(p)
        delays = self._allreduce_delay

        def hook(*ignore):
            started = self._handles.get(p)
            left = delays[p]
            if started is not None and started[0] is not None and left <= 0:
                raise AssertionError("Gradients were computed more than backward_passes_per_step times before "
                                     "call to step(). Increase backward_passes_per_step to accumulate "
                                     "gradients locally.")
            assert not p.grad.requires_grad
            assert left > 0
            handle, ctx = None, None
            left = delays[p] = left - 1
            if left == 0:
                if self._groups is not None:
                    group = self._p_to_group[p]
                    self._group_counts[group] += 1
                    if self._group_counts[group] == len(group):
                        self._handles[group] = self._grouped_allreduce_grad_async(group)
                        for member in group:
                            self._handles.pop(member, None)
                        self._group_counts[group] = 0
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p, name)
            self._handles[p] = (handle, ctx)
        return hook

    # --- synchronize / step -----------------------------------------------------------------
    def synchronize(self):
        """Wait for every gradient's allreduce (starting those not yet started) and put the
        averaged gradients into ``p.grad``."""
        # without groups the keys are parameters of _requires_update: as many means none is missing
        if self._groups is not None or len(self._handles) != len(self._requires_update):
            done = set()
            for key in self._handles:
                done.update(key) if isinstance(key, tuple) else done.add(key)
            for p in self._requires_update - done:
                self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)

        items = list(self._handles.items())
        # every dense allreduce (and group) waited for in one core call; sparse ones by their callable
        waited = iter(synchronize_all([handle for _, (handle, _) in items if not callable(handle)]))
        for key, (handle, ctx) in items:
            if isinstance(key, tuple):
                outputs = next(waited)
                for p, out, pctx in zip(key, outputs, ctx):
                    self._allreduce_delay[p] = self.backward_passes_per_step
                    reduced = self._compression.decompress(out, pctx)
                    if reduced is not p.grad:
                        p.grad.set_(reduced)
                if self._groups is not None:
                    self._group_counts[key] = 0
                continue
            p = key
            out = handle() if callable(handle) else next(waited)
            self._allreduce_delay[p] = self.backward_passes_per_step
            if self._groups is not None:
                self._group_counts[self._p_to_group[p]] = 0
            grad = p.grad
            if grad.is_sparse:
                reduced = self._compression.decompress(out, ctx)
                if not reduced.is_sparse:
                    reduced = reduced.to_sparse()
                grad.zero_().add_(reduced)
            else:
                reduced = self._compression.decompress(out, ctx)
                if reduced is not grad:  # the in-place allreduce left it in p.grad already
                    grad.set_(reduced)
        self._handles.clear()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """Inside this context ``step()`` does not synchronize; use it after an explicit
        ``synchronize()`` (for example to clip the averaged gradients first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to "
                              "consider using optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        out = super().step(closure)
        _metrics.note_step("optimizer")
        return out


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=global_process_set):
    """Wrap ``optimizer`` so that ``step()`` applies gradients averaged (``op``) over all ranks.

    ``named_parameters``: ``model.named_parameters()``, to name the allreduces (recommended);
    ``compression``: ``Compression.none``/``fp16``; ``backward_passes_per_step``: local
    accumulation steps before the allreduce; ``gradient_predivide_factor``: for op=Average,
    divide by it before the sum and by ``size/factor`` after; ``groups``: an int (that many
    groups) or lists of parameters allreduced together; ``num_groups``: deprecated ``groups``.
    ``op=hvd.Adasum`` (more than one rank, or elastic): Horovod's delta optimizer, where each rank steps
    locally and the parameter updates are combined with Adasum (``appliance.torch.adasum_optimizer``;
    ``groups`` and ``sparse_as_dense`` do not apply there).
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    _ps.require_registered(process_set)
    if op == Adasum and (size() > 1 or _elastic()):
        cls = type(optimizer.__class__.__name__, (DistributedAdasumOptimizer, optimizer.__class__), {})
        names = _parameter_names(optimizer.param_groups, named_parameters)
        return cls(optimizer.param_groups, names, compression, backward_passes_per_step, process_set)
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set)
