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
with Adasum raises ``HorovodInternalError`` (as Horovod); process sets other than the global one
raise ``NotImplementedError`` naming issue 9; ``synchronize`` raises
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
from appliance.torch._tensors import from_result, stage

_handles = _tensors.HandleTable()
_REDUCE_OPS = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}
_HOST_DTYPES = _tensors.HOST_DTYPES
_FAST_OPS = frozenset((None, *_REDUCE_OPS))  # op= values allreduce_async_'s short path takes (None: Average)


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


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks (judged from this rank's view)."""
    return local_size() * cross_size() == size()


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


def _host_allreduce_(t, name, op, pre, post, group_id=0, group_size=0, out=None) -> int:
    """The short path: enqueue an allreduce of ``t`` (contiguous, on the host, of a supported
    dtype) over every rank into ``out`` (a new contiguous tensor like ``t``; None: in place), in
    one core call; return its engine handle."""
    ptr = t.data_ptr()
    return _engine.current().allreduce_host(name, ptr, ptr if out is None else out.data_ptr(), _HOST_DTYPES[t.dtype],
                                            t.shape, op, pre, post, group_id, group_size)


def _submit(kind, name, work, out=None, **kw) -> int:
    if out is work and kind is Kind.ALLREDUCE and work.is_cpu and not kw.get("process_set"):  # the short way
        return _host_allreduce_(work, name, kw["op"], kw["prescale"], kw["postscale"], *kw.get("group", (0, 0)))
    inp = None if work is None else _tensors.buffer(work)
    outb = inp if out is work else None if out is None else _tensors.buffer(out)  # in place: one description
    return _engine.submit(kind, name, inp, outb, **kw)  # kw: op, scales, root, splits, group, process_set


def _submit_all(calls) -> list:
    """Submit several engine operations; if one is refused, keep the already submitted ones
    (and their tensors) in the table so nothing is freed under the core, then re-raise."""
    handles = []
    try:
        for kind, name, work, out, kw in calls:
            handles.append(_submit(kind, name, work, out, **kw))
    except Exception:
        if handles:
            _handles.add(handles, tuple(calls), lambda rs: None)
        raise
    return handles


# --- allreduce ---------------------------------------------------------------------------
def _allreduce_async(tensor, inplace, name, op, prescale_factor, postscale_factor, process_set) -> int:
    ps = check_process_set(process_set)
    core_op = _core_op(op)
    if not ps and tensor.is_cpu and tensor.dtype in _HOST_DTYPES and tensor.is_contiguous():  # the short way
        if inplace:
            return _handles.add_host(_host_allreduce_(tensor, name, core_op, prescale_factor, postscale_factor), tensor)
        out = torch.empty(tensor.shape, dtype=tensor.dtype)
        h = _host_allreduce_(tensor, name, core_op, prescale_factor, postscale_factor, out=out)
        return _handles.add_host(h, out, keep=tensor)
    work = stage(tensor)
    out = work if inplace else _tensors.empty_like(work)
    h = _submit(Kind.ALLREDUCE, name, work, out, op=core_op, prescale=float(prescale_factor),
                postscale=float(postscale_factor), process_set=ps)
    if inplace:
        return _handles.add([h], (tensor, work), lambda rs: _tensors.copy_back(tensor, work))
    return _handles.add([h], (tensor, work, out), lambda rs: _tensors.to_device(out, tensor))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set) -> int:
    """Start reducing ``tensor`` over all ranks (default op Average) into a new tensor; return a
    handle for ``poll``/``synchronize``. The input is not modified."""
    op = resolve_op(op, average)
    return _allreduce_async(tensor, False, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set) -> int:
    """In-place ``allreduce_async``: ``synchronize`` returns ``tensor`` holding the result."""
    if average is None and process_set is global_process_set and tensor.is_cpu:
        # The call a backward pass makes per gradient, in few steps: a contiguous host tensor of a
        # supported dtype over every rank. Anything else takes the general path below.
        if tensor.dtype in _HOST_DTYPES and op in _FAST_OPS and tensor.is_contiguous():
            h = _host_allreduce_(tensor, name, Average if op is None else op, prescale_factor, postscale_factor)
            return _handles.add_host(h, tensor)
    op = resolve_op(op, average)
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


def _grouped_allreduce_async(tensors, inplace, name, op, prescale_factor, postscale_factor, process_set) -> int:
    ps = check_process_set(process_set)
    core_op = _core_op(op)
    tensors = list(tensors)
    if inplace and ps == 0 and tensors and all(t.is_cpu and t.is_contiguous() and t.dtype in _HOST_DTYPES
                                               for t in tensors):
        return _grouped_host_allreduce_(tensors, name, core_op, float(prescale_factor), float(postscale_factor))
    _one_device_kind(tensors, "grouped allreduce")
    works = [stage(t) for t in tensors]
    outs = works if inplace else [_tensors.empty_like(w) for w in works]
    group = (_engine.new_group_id(ps), len(tensors)) if tensors else (0, 0)
    kw = dict(op=core_op, prescale=float(prescale_factor), postscale=float(postscale_factor), group=group,
              process_set=ps)
    handles = _submit_all([(Kind.ALLREDUCE, _member_name(name, i), w, o, kw)
                           for i, (w, o) in enumerate(zip(works, outs))])
    if inplace:
        finish = lambda rs: tuple(_tensors.copy_back(t, w) for t, w in zip(tensors, works))  # noqa: E731
    else:
        finish = lambda rs: tuple(_tensors.to_device(o, t) for t, o in zip(tensors, outs))  # noqa: E731
    return _handles.add(handles, (tuple(tensors), tuple(works), tuple(outs)), finish)


def _grouped_host_allreduce_(tensors, name, core_op, pre, post) -> int:
    """The grouped in-place allreduce of contiguous host tensors over every rank, on the short
    path of ``allreduce_async_``: one core call for all the members, a bare handle-table entry."""
    names = [_member_name(name, i) or "" for i in range(len(tensors))]  # "": an automatic name
    try:
        handles = _engine.current().allreduce_host_group(
            names, [t.data_ptr() for t in tensors], [_HOST_DTYPES[t.dtype] for t in tensors],
            [t.shape for t in tensors], core_op, pre, post, _engine.new_group_id(0))
    except ValueError as e:
        if getattr(e, "handles", None):  # keep the enqueued members' tensors alive until the core is done
            _handles.add_host(e.handles, tuple(tensors))
        raise
    return _handles.add_host(handles, tuple(tensors))


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
        values = synchronize(h_val)
        indices = synchronize(h_idx)
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
    h = _submit(Kind.ALLGATHER, name, work, process_set=ps)
    return _handles.add([h], (tensor, work), lambda rs: from_result(rs[0], tensor.dtype, tensor))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> int:
    ps = check_process_set(process_set)
    tensors = list(tensors)
    _one_device_kind(tensors, "grouped allgather")
    works = [stage(t) for t in tensors]
    for w in works:
        _first_dim(w, "allgather")
    group = (_engine.new_group_id(ps), len(works)) if works else (0, 0)
    handles = _submit_all([(Kind.ALLGATHER, _member_name(name, i), w, None, dict(process_set=ps, group=group))
                           for i, w in enumerate(works)])
    finish = lambda rs: tuple(from_result(r, t.dtype, t) for r, t in zip(rs, tensors))  # noqa: E731
    return _handles.add(handles, (tuple(tensors), tuple(works)), finish)


# --- broadcast ---------------------------------------------------------------------------
def _broadcast_async(tensor, inplace, root_rank, name, process_set) -> int:
    ps = check_process_set(process_set)
    root = _ps.root_of(process_set, root_rank)  # a job rank, as in Horovod; the core wants its index in the set
    work = stage(tensor)
    if inplace:
        h = _submit(Kind.BROADCAST, name, work, work, root=root, process_set=ps)
        return _handles.add([h], (tensor, work), lambda rs: _tensors.copy_back(tensor, work))
    out = _tensors.empty_like(work)
    h = _submit(Kind.BROADCAST, name, work, out, root=root, process_set=ps)
    return _handles.add([h], (tensor, work, out), lambda rs: _tensors.to_device(out, tensor))


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
    h = _submit(Kind.ALLTOALL, name, work, splits=counts, process_set=ps)

    def finish(rs):
        out = from_result(rs[0], tensor.dtype, tensor)
        return out, torch.tensor(list(rs[0].splits), dtype=rdtype, device=rdevice)
    return _handles.add([h], (tensor, work), finish)


# --- reducescatter -------------------------------------------------------------------------
def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0) -> int:
    """Start reducing ``tensor`` (same shape on every rank) and keep this rank's block of the
    first dimension: rank r gets ``dim0 // size`` rows, one more when ``r < dim0 % size``."""
    ps = check_process_set(process_set)
    core_op = _core_op(op, allreduce=False)
    work = stage(tensor)
    _first_dim(work, "reducescatter")
    h = _submit(Kind.REDUCESCATTER, name, work, op=core_op, prescale=float(prescale_factor),
                postscale=float(postscale_factor), process_set=ps)
    return _handles.add([h], (tensor, work), lambda rs: from_result(rs[0], tensor.dtype, tensor))


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    ps = check_process_set(process_set)
    core_op = _core_op(op, allreduce=False)
    tensors = list(tensors)
    _one_device_kind(tensors, "grouped reducescatter")
    works = [stage(t) for t in tensors]
    for w in works:
        _first_dim(w, "reducescatter")
    group = (_engine.new_group_id(ps), len(works)) if works else (0, 0)
    kw = dict(op=core_op, prescale=float(prescale_factor), postscale=float(postscale_factor), group=group,
              process_set=ps)
    handles = _submit_all([(Kind.REDUCESCATTER, _member_name(name, i), w, None, kw) for i, w in enumerate(works)])
    finish = lambda rs: tuple(from_result(r, t.dtype, t) for r, t in zip(rs, tensors))  # noqa: E731
    return _handles.add(handles, (tuple(tensors), tuple(works)), finish)


# --- completion, join, barrier -------------------------------------------------------------
def poll(handle) -> bool:
    """True when the operation behind ``handle`` has finished; never blocks."""
    return _handles.poll(handle)


def synchronize(handle):
    """Wait for ``handle`` and return its output (tensor, tuple of tensors, or for alltoall
    ``(tensor, received_splits)``). An unknown handle returns None, as in Horovod."""
    return _handles.synchronize(handle)


def join(device=-1) -> int:
    """Declare that this rank has no more data; block until every rank has joined and return
    the rank that joined last. ``device``: the CUDA device this rank contributes zeros on in
    CUDA allreduces it misses (default: torch's current device when CUDA is in use, else host)."""
    device = int(device)
    if device < 0 and torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
    desc = _engine.Buffer(0, _engine.DType.UINT8, (), device) if device >= 0 else None
    return int(_engine.wait(_engine.submit(Kind.JOIN, None, desc)).value)


def barrier(process_set=global_process_set) -> None:
    """Return once every rank of ``process_set`` has entered the barrier."""
    ps = check_process_set(process_set)
    _engine.wait(_engine.submit(Kind.BARRIER, None, process_set=ps))


# The out-of-place, autograd-aware collectives (they build on the functions above), their
# torch.autograd.Function classes under Horovod's names, and Compression (horovod.torch.mpi_ops
# exports it: ``hvd.mpi_ops.Compression.none``).
from appliance.torch._autograd import (  # noqa: E402,F401
    HorovodAllgather, HorovodAllreduce, HorovodAlltoall, HorovodBroadcast, HorovodGroupedAllgather,
    HorovodGroupedAllreduce, HorovodGroupedReducescatter, HorovodReducescatter, allgather, allreduce, alltoall,
    broadcast, grouped_allgather, grouped_allreduce, grouped_reducescatter, reducescatter,
)
from appliance.torch.compression import Compression  # noqa: E402,F401
