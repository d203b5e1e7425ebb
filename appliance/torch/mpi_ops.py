"""Horovod's ``horovod.torch.mpi_ops`` over the appliance's collective runtime.

What it is: the lifecycle (``init``/``shutdown``, ranks and sizes), the asynchronous and
in-place collectives on ``torch.Tensor`` (handles are ints, as in Horovod), ``poll`` /
``synchronize``, ``join``/``barrier``, the ``*_built``/``*_enabled`` probes, and the process-set
names. The out-of-place, autograd-aware collectives live in ``appliance.torch._autograd`` and
are re-exported at the end of this module.

What it owns: the table of in-flight handles (``_handles``), which keeps every tensor the
core may touch alive until ``synchronize``; it is emptied by ``init`` of a fresh runtime and by
``shutdown``. The runtime itself is owned by ``appliance.runtime.api``.

Environment: none read here; ``init`` reads the job layout through ``appliance.runtime.config``
(HOROVOD_RANK/SIZE..., APPLIANCE_STORE_ADDR, APPLIANCE_JOB_SECRET; none = a single rank).

Failure modes: every call before ``init`` raises ``ValueError`` (as Horovod); unsupported
dtypes/devices and bad arguments raise ``ValueError`` (Adasum on integer tensors too); reducescatter
with Adasum raises ``HorovodInternalError`` (as Horovod); an operation on a process set this rank
is not in (or an unregistered one) raises ``ValueError`` naming the set; ``synchronize`` raises
``HorovodInternalError`` when the job failed (names the origin rank and host) and
``MismatchError`` when ranks disagree on a tensor (the runtime stays usable).
"""
from __future__ import annotations

import operator
import types
import warnings
from typing import Optional

import torch

from appliance.runtime import api as _api
from appliance.runtime import engine as _engine
from appliance.runtime import process_sets as _ps
from appliance.runtime.engine import Adasum, Average, Kind, Max, Min, Product, Sum  # noqa: F401
from appliance.hvdcompat.util import get_average_backwards_compatibility_fun
from appliance.runtime.errors import HorovodInternalError, MismatchError  # noqa: F401
from appliance.torch import _tensors
from appliance.torch._tensors import cuda_device, describe, from_result, host_desc, stage

_handles = _tensors.HandleTable()
_REDUCE_OPS = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}
_ALLREDUCE = Kind.ALLREDUCE


# --- process sets (appliance.runtime.process_sets; Horovod's names) ----------------------------
ProcessSet = _ps.ProcessSet
global_process_set = _ps.global_process_set
add_process_set = _ps.add_process_set
remove_process_set = _ps.remove_process_set


def check_process_set(process_set) -> int:
    """The core id of ``process_set=`` (ValueError when it is unregistered or lacks this rank)."""
    return _ps.resolve(process_set)


# --- lifecycle and basics -----------------------------------------------------------------
def init(comm=None, process_sets=None) -> None:
    """Join the job the environment describes (a single rank without a launcher). A second
    call is a no-op. ``process_sets``: a list of ``ProcessSet`` (or rank lists) registered on
    every rank, or ``"dynamic"`` to allow ``add_process_set`` later. ``comm`` (a list of ranks or
    an MPI communicator) is accepted when it names every rank; narrower raises NotImplementedError."""
    fresh = not _api.is_initialized()
    _api.init()
    _tensors.setup()  # the core takes CUDA outputs from torch's allocator
    if not fresh:
        return
    _handles.clear()
    try:
        _ps.check_comm(comm)
        _ps.setup(process_sets)
    except Exception:
        shutdown()
        raise


def shutdown() -> None:
    """Leave the job; pending operations fail and their handles are forgotten. Idempotent."""
    _api.shutdown()
    _handles.clear()


is_initialized = _api.is_initialized
size = _api.size
rank = _api.rank
local_size = _api.local_size
local_rank = _api.local_rank
cross_size = _api.cross_size
cross_rank = _api.cross_rank
is_homogeneous = _api.is_homogeneous


# Horovod's name for the ``average=``/``op=`` resolution (horovod.torch.mpi_ops exports it).
def handle_average_backwards_compatibility(op, average):
    """``op`` if given, else Average/Sum from the deprecated ``average`` (ValueError if both)."""
    return resolve_op(op, average)


def start_timeline(file_path, mark_cycles=False) -> None:
    """Rank 0 writes Horovod's timeline to ``file_path`` (see ``appliance.runtime.api``)."""
    _api.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Close the timeline file (valid JSON from then on); idempotent."""
    _api.stop_timeline()


# What this build is: our own runtime, neither MPI nor Gloo; CUDA/NCCL as the core reports.
def mpi_built() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    raise ValueError("Horovod MPI is not enabled: this runtime does not use MPI (it only accepts "
                     "OpenMPI's mpirun as a process launcher)")


def gloo_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def nccl_built() -> int:
    """NCCL's version code (e.g. 22907 for 2.29.7) when the core runs CUDA collectives through
    NCCL here, else 0 (as Horovod). ``appliance.runtime.engine.capabilities()`` says why not."""
    caps = _tensors.capabilities()
    return int(caps.get("nccl_version", 0)) if caps.get("nccl", False) else 0


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    """True when the core operates on CUDA memory here (a CUDA runtime it can load and a device)."""
    return bool(_tensors.capabilities().get("cuda", False))


def rocm_built() -> bool:
    return False


# --- argument handling shared by the collectives ---------------------------------------------
# Horovod's handling of the deprecated ``average=`` argument (one definition, in hvdcompat.util).
resolve_op = get_average_backwards_compatibility_fun(types.SimpleNamespace(Average=Average, Sum=Sum))


def _core_op(op, allreduce: bool = True) -> int:
    """The core's op code. Adasum is an allreduce of floating point tensors (the core refuses
    other dtypes with ``ValueError``); any other collective raises Horovod's error for it."""
    if op not in _REDUCE_OPS:
        raise ValueError(f"unknown reduction op {op!r} (use hvd.Average, Sum, Adasum, Min, Max or Product)")
    if op == Adasum and not allreduce:
        raise HorovodInternalError("Reducescatter does not support Adasum (ops: Average, Sum, Min, Max, Product)")
    return op


def _first_dim(work: torch.Tensor, what: str) -> int:
    if work.dim() == 0:
        raise ValueError(f"{what} needs a tensor with at least one dimension, got a scalar")
    return int(work.shape[0])


def _member_name(name: Optional[str], i: int) -> Optional[str]:
    return None if name is None else f"{name}.{i}"


def _allreduce_request(op, prescale, postscale, process_set):
    """The Request of an allreduce, from the engine's one cache (``engine.request``); op checked
    as ``_core_op`` does, ``process_set`` checked."""
    ps = 0 if process_set is global_process_set else check_process_set(process_set)
    if op not in _REDUCE_OPS:
        _core_op(op)
    return _engine.request(Kind.ALLREDUCE, op, prescale, postscale, 0, ps)


# --- allreduce ---------------------------------------------------------------------------
def _allreduce_async(tensor, inplace, name, op, prescale_factor, postscale_factor, process_set) -> int:
    req = _engine.cached_request((_ALLREDUCE, op, prescale_factor, postscale_factor, 0, 0)) \
        if process_set is global_process_set else None
    if req is None:
        req = _allreduce_request(op, prescale_factor, postscale_factor, process_set)
    short = host_desc(tensor, inplace)
    if short is not None:  # the core reads (and writes) the tensor as it is
        desc, out = short
        return _handles.add(_engine.current().submit(req, name, desc), out, None if out is tensor else tensor)
    return _allreduce_staged(tensor, inplace, name, req)


def _allreduce_staged(tensor, inplace, name, req) -> int:
    # Apart from _allreduce_async: its closures would make cells of these names on every call.
    work = stage(tensor)
    out = work if inplace else _tensors.empty_like(work)
    h = _engine.current().submit(req, name, describe(work, out))
    if inplace:
        return _handles.add(h, None, (tensor, work), lambda r: _tensors.copy_back(tensor, work), cuda_device(work))
    return _handles.add(h, None, (tensor, work, out), lambda r: _tensors.to_device(out, tensor), cuda_device(work))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set) -> int:
    """Start reducing ``tensor`` over all ranks (default op Average) into a new tensor; return a
    handle for ``poll``/``synchronize``. The input is not modified."""
    op = resolve_op(op, average)
    return _allreduce_async(tensor, False, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set) -> int:
    """In-place ``allreduce_async``: ``synchronize`` returns ``tensor`` holding the result."""
    op = (Average if op is None else op) if average is None else resolve_op(op, average)
    return _allreduce_async(tensor, True, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    op = resolve_op(op, average)
    return synchronize(_allreduce_async(tensor, True, name, op, prescale_factor, postscale_factor, process_set))


def _one_device_kind(tensors, what: str) -> None:
    kinds = {t.device.type for t in tensors}
    if len(kinds) > 1:  # as Horovod: one group runs on one kind of device
        raise MismatchError(f"{what}: the tensors of one group are on {' and '.join(sorted(kinds))}; "
                            "put them on one device (or use separate calls)")


def _submit_group(req, name, descs, keep) -> list:
    """Submit the members of one group (member i named ``name.i``) in one core call; return their
    handles. When a member is refused, the members enqueued before it keep ``keep`` in the table
    (nothing is freed under the core), and the ValueError goes on."""
    names = [_member_name(name, i) for i in range(len(descs))]
    try:
        return _engine.current().submit(req, names, descs)
    except ValueError as e:
        if getattr(e, "handles", None):
            _handles.add(e.handles, None, keep)
        raise


def _grouped_allreduce_async(tensors, inplace, name, op, prescale_factor, postscale_factor, process_set) -> int:
    req = _allreduce_request(op, prescale_factor, postscale_factor, process_set)
    tensors = list(tensors)
    if not tensors:
        return _handles.add([], ())
    shorts = [host_desc(t, inplace) for t in tensors]
    if None not in shorts:  # the core reads (and writes) every member as it is
        outs = tuple(o for _, o in shorts)
        keep = (tuple(tensors), outs)
        return _handles.add(_submit_group(req, name, [d for d, _ in shorts], keep), outs, keep)
    _one_device_kind(tensors, "grouped allreduce")
    works = [stage(t) for t in tensors]
    outs = works if inplace else [_tensors.empty_like(w) for w in works]
    keep = (tuple(tensors), tuple(works), tuple(outs))
    handles = _submit_group(req, name, [describe(w, o) for w, o in zip(works, outs)], keep)
    if inplace:
        finish = lambda r: tuple(_tensors.copy_back(t, w) for t, w in zip(tensors, works))  # noqa: E731
    else:
        finish = lambda r: tuple(_tensors.to_device(o, t) for t, o in zip(tensors, outs))  # noqa: E731
    return _handles.add(handles, None, keep, finish, cuda_device(works[0]))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> int:
    """Reduce a list of tensors as one group (scheduled together); one handle, whose
    ``synchronize`` returns a tuple of new tensors. Member i is named ``f"{name}.{i}"``."""
    op = resolve_op(op, average)
    return _grouped_allreduce_async(tensors, False, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> int:
    op = resolve_op(op, average)
    return _grouped_allreduce_async(tensors, True, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    op = resolve_op(op, average)
    return synchronize(_grouped_allreduce_async(tensors, True, name, op, prescale_factor, postscale_factor,
                                                process_set))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Reduce a sparse COO tensor by gathering every rank's indices and values. Returns a
    callable that waits and yields the combined sparse tensor (as Horovod)."""
    n = _ps.size_of(process_set)
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    h_idx = allgather_async(t._indices().transpose(0, 1).contiguous(),
                            name=None if name is None else f"{name}.indices", process_set=process_set)
    h_val = allgather_async(t._values(), name=None if name is None else f"{name}.values", process_set=process_set)

    def wait():
        indices, values = synchronize_all([h_idx, h_val])
        if op == Average:
            values = values / n
        elif op != Sum:
            raise NotImplementedError("sparse allreduce supports op=Average and op=Sum only")
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.shape, check_invariants=False)
    return wait


# --- allgather ---------------------------------------------------------------------------
def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    """Start concatenating every rank's ``tensor`` along the first dimension (which may differ
    per rank); ``synchronize`` returns the new tensor."""
    ps = check_process_set(process_set)
    work = stage(tensor)
    _first_dim(work, "allgather")
    h = _engine.current().submit(_engine.request(Kind.ALLGATHER, process_set=ps), name, describe(work))
    return _handles.add(h, None, (tensor, work), lambda r: from_result(r, tensor.dtype, tensor), cuda_device(work))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> int:
    ps = check_process_set(process_set)
    tensors = list(tensors)
    if not tensors:
        return _handles.add([], ())
    _one_device_kind(tensors, "grouped allgather")
    works = [stage(t) for t in tensors]
    for w in works:
        _first_dim(w, "allgather")
    keep = (tuple(tensors), tuple(works))
    handles = _submit_group(_engine.request(Kind.ALLGATHER, process_set=ps), name, [describe(w) for w in works], keep)
    finish = lambda rs: tuple(from_result(r, t.dtype, t) for r, t in zip(rs, tensors))  # noqa: E731
    return _handles.add(handles, None, keep, finish, cuda_device(works[0]))


# --- broadcast ---------------------------------------------------------------------------
def _broadcast_async(tensor, inplace, root_rank, name, process_set) -> int:
    ps = check_process_set(process_set)
    root = _ps.root_of(process_set, root_rank)  # a job rank, as in Horovod; the core wants its index in the set
    req = _engine.request(Kind.BROADCAST, root=root, process_set=ps)
    work = stage(tensor)
    if inplace:
        h = _engine.current().submit(req, name, describe(work, work))
        return _handles.add(h, None, (tensor, work), lambda r: _tensors.copy_back(tensor, work), cuda_device(work))
    out = _tensors.empty_like(work)
    h = _engine.current().submit(req, name, describe(work, out))
    return _handles.add(h, None, (tensor, work, out), lambda r: _tensors.to_device(out, tensor), cuda_device(work))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    """Start copying root's ``tensor`` to every rank into a new tensor."""
    return _broadcast_async(tensor, False, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    """In-place ``broadcast_async``: ``synchronize`` returns ``tensor`` holding root's data."""
    return _broadcast_async(tensor, True, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(_broadcast_async(tensor, True, root_rank, name, process_set))


# --- alltoall ----------------------------------------------------------------------------
def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    """Send rows ``splits[p]`` (consecutive, in rank order) of ``tensor`` to each rank p; without
    ``splits`` the first dimension is divided equally. ``synchronize`` returns
    ``(received tensor, rows received from each rank)``."""
    ps = check_process_set(process_set)
    work = stage(tensor)
    rows, n = _first_dim(work, "alltoall"), _ps.size_of(process_set)
    if splits is None:
        if rows % n:
            raise ValueError(f"alltoall without splits: the first dimension ({rows}) of the tensor is not "
                             f"divisible by the number of ranks ({n})")
        counts, rdtype, rdevice = [rows // n] * n, torch.int32, torch.device("cpu")
    else:
        if isinstance(splits, torch.Tensor):
            if splits.dtype not in (torch.int32, torch.int64):
                # Horovod refuses any other dtype, whatever the values (a float tensor from
                # torch.empty would otherwise pass on some ranks and not on others)
                raise ValueError(f"alltoall splits must be a tensor of 32- or 64-bit integers, got {splits.dtype}")
            counts, rdtype, rdevice = [int(s) for s in splits.reshape(-1).tolist()], splits.dtype, splits.device
        else:
            try:
                counts = [operator.index(s) for s in splits]
            except TypeError:
                raise ValueError(f"alltoall splits must be integers, got {list(splits)!r}") from None
            rdtype, rdevice = torch.int32, torch.device("cpu")
        if len(counts) != n or any(c < 0 for c in counts) or sum(counts) != rows:
            raise ValueError(f"alltoall splits {counts} must be {n} non-negative row counts summing to the "
                             f"first dimension of the tensor ({rows})")
    h = _engine.current().submit(_engine.request(Kind.ALLTOALL, process_set=ps, splits=counts), name, describe(work))

    def finish(r):
        out = from_result(r, tensor.dtype, tensor)
        return out, torch.tensor(list(r.splits), dtype=rdtype, device=rdevice)
    return _handles.add(h, None, (tensor, work), finish, cuda_device(work))


# --- reducescatter -------------------------------------------------------------------------
def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0) -> int:
    """Start reducing ``tensor`` (same shape on every rank) and keep this rank's block of the
    first dimension: rank r gets ``dim0 // size`` rows, one more when ``r < dim0 % size``."""
    ps = check_process_set(process_set)
    req = _engine.request(Kind.REDUCESCATTER, _core_op(op, allreduce=False), prescale_factor, postscale_factor,
                          process_set=ps)
    work = stage(tensor)
    _first_dim(work, "reducescatter")
    h = _engine.current().submit(req, name, describe(work))
    return _handles.add(h, None, (tensor, work), lambda r: from_result(r, tensor.dtype, tensor), cuda_device(work))


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    ps = check_process_set(process_set)
    req = _engine.request(Kind.REDUCESCATTER, _core_op(op, allreduce=False), prescale_factor, postscale_factor,
                          process_set=ps)
    tensors = list(tensors)
    if not tensors:
        return _handles.add([], ())
    _one_device_kind(tensors, "grouped reducescatter")
    works = [stage(t) for t in tensors]
    for w in works:
        _first_dim(w, "reducescatter")
    keep = (tuple(tensors), tuple(works))
    handles = _submit_group(req, name, [describe(w) for w in works], keep)
    finish = lambda rs: tuple(from_result(r, t.dtype, t) for r, t in zip(rs, tensors))  # noqa: E731
    return _handles.add(handles, None, keep, finish, cuda_device(works[0]))


# --- completion, join, barrier -------------------------------------------------------------
def poll(handle) -> bool:
    """True when the operation behind ``handle`` has finished; never blocks."""
    return _handles.poll(handle)


def synchronize(handle):
    """Wait for ``handle`` and return its output (tensor, tuple of tensors, or for alltoall
    ``(tensor, received_splits)``). An unknown handle returns None, as in Horovod."""
    return _handles.synchronize(handle)


def synchronize_all(handles) -> list:
    """``[synchronize(h) for h in handles]``, the host operations among them waited for in one
    core call; after a failure every operation is still waited for, then the first failure is
    raised. Not in Horovod's API (``DistributedOptimizer`` waits for its gradients this way)."""
    return _handles.synchronize_all(handles)


def join(device=-1) -> int:
    """Declare that this rank has no more data; block until every rank has joined and return
    the rank that joined last. ``device``: the CUDA device this rank contributes zeros on in
    CUDA allreduces it misses (default: torch's current device when CUDA is in use, else host)."""
    device = int(device)
    if device < 0 and torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
    desc = _engine.TensorDesc(0, _engine.DType.UINT8, (), device=device) if device >= 0 else None
    return int(_engine.wait(_engine.submit(_engine.request(Kind.JOIN), None, desc)).value)


def barrier(process_set=global_process_set) -> None:
    """Return once every rank of ``process_set`` has entered the barrier."""
    ps = check_process_set(process_set)
    _engine.wait(_engine.submit(_engine.request(Kind.BARRIER, process_set=ps), None))


# The out-of-place, autograd-aware collectives (they build on the functions above), their
# torch.autograd.Function classes under Horovod's names, and Compression (horovod.torch.mpi_ops
# exports it: ``hvd.mpi_ops.Compression.none``).
from appliance.torch._autograd import (  # noqa: E402,F401
    HorovodAllgather, HorovodAllreduce, HorovodAlltoall, HorovodBroadcast, HorovodGroupedAllgather,
    HorovodGroupedAllreduce, HorovodGroupedReducescatter, HorovodReducescatter, allgather, allreduce, alltoall,
    broadcast, grouped_allgather, grouped_allreduce, grouped_reducescatter, reducescatter,
)
from appliance.torch.compression import Compression  # noqa: E402,F401
