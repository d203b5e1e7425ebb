"""Horovod's ``horovod.tensorflow.mpi_ops`` over the appliance's collective runtime.

What it is: the lifecycle (``init``/``shutdown``, ranks and sizes: the runtime's, shared with
``appliance.torch`` in one process), the raw collectives on ``tf.Tensor`` (``raw_allreduce``,
``raw_grouped_allreduce``, ``raw_reducescatter``, ``raw_grouped_reducescatter``, also under
Horovod's names ``_allreduce``..., ``allgather``, ``grouped_allgather``, ``broadcast``,
``alltoall``, ``join``; ``eager_allreduce``, the short path of an eager allreduce over every
rank), the scalar ops evaluated when a graph
runs (``size_op``, ``rank_op``...), and the gradients that make the collectives differentiable
(allreduce's is an allreduce; allgather's an averaged allreduce sliced back to this rank's rows;
broadcast's an averaged allreduce, zero off the root). The ops are asynchronous kernels of the op
library (``_library``), which the first op loads (compiling it once for the installed TensorFlow).

Names: in a graph (``tf.function``, a v1 session) an op is negotiated by its node name, which
Horovod derives from the tensor's name, so ranks that build the same graph agree; eagerly, ops
run one at a time and share the kernel's name.

Environment: none read here (``init`` reads the job layout through ``appliance.runtime.config``).
Failure modes: Python calls before ``init`` raise ``ValueError`` (as Horovod's); an op that runs
before ``init`` fails with ``tf.errors.FailedPreconditionError``; ranks that disagree on a tensor
fail with ``FailedPreconditionError`` (the runtime stays usable); a failed job with
``tf.errors.UnknownError`` naming the origin rank and host; an unsupported dtype with
``InvalidArgumentError``.
"""
from __future__ import annotations

import re

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context as _context
from tensorflow.python.eager import record as _record
from tensorflow.python.framework import ops as _tf_ops

from appliance.hvdcompat.basics import HorovodBasics
from appliance.hvdcompat.util import get_average_backwards_compatibility_fun
from appliance.runtime import api as _api
from appliance.runtime import engine as _engine
from appliance.runtime import process_sets as _ps
from appliance.runtime.engine import Adasum, Average, Max, Min, Product, Sum  # noqa: F401
from appliance.runtime.errors import HorovodInternalError  # noqa: F401
from appliance.tensorflow import _library

# --- process sets (appliance.runtime.process_sets; Horovod's names) ----------------------------
ProcessSet = _ps.ProcessSet
global_process_set = _ps.global_process_set
add_process_set = _ps.add_process_set
remove_process_set = _ps.remove_process_set


# --- lifecycle and basics ----------------------------------------------------------------------
_basics = HorovodBasics(__file__)  # Horovod's name: a view of the one runtime
def init(comm=None, process_sets=None) -> None:
    """Join the job the environment describes (a single rank without a launcher); a second call
    is a no-op. ``process_sets``: ``ProcessSet``s registered on every rank, or ``"dynamic"``."""
    fresh = not _api.is_initialized()
    _api.init()
    if not fresh:
        return
    try:
        _ps.check_comm(comm)
        _ps.setup(process_sets)
    except Exception:
        shutdown()
        raise


shutdown = _api.shutdown
is_initialized = _api.is_initialized
size = _api.size
rank = _api.rank
local_size = _api.local_size
local_rank = _api.local_rank
cross_size = _api.cross_size
cross_rank = _api.cross_rank
is_homogeneous = _api.is_homogeneous
start_timeline = _api.start_timeline
stop_timeline = _api.stop_timeline


handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(
    type("_Ops", (), {"Average": Average, "Sum": Sum, "Adasum": Adasum}))


def mpi_threads_supported() -> bool:
    _api.size()  # ValueError before init, as Horovod's
    return False


def mpi_built() -> bool:
    return False


mpi_enabled = gloo_enabled = gloo_built = nccl_built = ddl_built = ccl_built = cuda_built = rocm_built = mpi_built


def _lib():
    return _library.library()


def _normalize_name(name: str) -> str:
    """A name as TensorFlow allows it in a node name."""
    return re.sub("[^a-zA-Z0-9_]", "_", name)


def _executing_eagerly() -> bool:
    return tf.executing_eagerly()


def _set_id(process_set) -> int:
    """The core id of ``process_set=``: ValueError when it is not registered (as Horovod's). A
    registered set that does not hold this rank is passed on: its op fails when it runs, with
    InvalidArgumentError from the core (as Horovod's), so a graph may hold ops of other sets."""
    _ps.require_registered(process_set)
    return getattr(process_set, "process_set_id", None) or 0


def set_size(process_set) -> int:
    """The size of a registered ``process_set`` (this rank need not be in it); ValueError before
    init or for a set that is not registered."""
    set_id = _set_id(process_set)
    return _api.size() if set_id == 0 else len(_ps.by_id(set_id).ranks)


# --- the raw collectives -----------------------------------------------------------------------
def raw_allreduce(tensor, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0, ignore_name_scope=False,
               process_set=global_process_set):
    """``tensor`` reduced over the ranks of ``process_set`` with ``op`` (scaled before and after)."""
    if name is None and not _executing_eagerly():
        name = "HorovodAllreduce_%s" % _normalize_name(tensor.name)
    return _lib().horovod_allreduce(tensor, name=name, reduce_op=op, prescale_factor=prescale_factor,
                                    postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                                    process_set_id=_set_id(process_set))


def eager_allreduce(tensor, name, op, prescale_factor, postscale_factor, ignore_name_scope):
    """``raw_allreduce`` of an eager tensor over every rank, by the short path a synchronous loop of
    small ops takes: no name to derive and no process set to look up; a small host tensor that no
    tape watches goes to the core as memory (``_host_allreduce``), others through the op. None when
    no eager execution runs here (inside a ``tf.function`` being traced: the caller takes the
    full path)."""
    ctx = _context._context or _context.context()  # the idiom of TensorFlow's own op wrappers
    if not ctx._thread_local_data.is_eager:
        return None
    _api.size()  # ValueError before init
    if (tensor._datatype_enum() in _HOST_DTYPES and "/device:CPU:" in tensor.device
            and not _record.could_possibly_record()):
        a = tensor._numpy()
        if a.nbytes <= _HOST_MAX_BYTES:
            return _host_allreduce(tensor, a, op, prescale_factor, postscale_factor)
    return _lib().horovod_allreduce(tensor, name=name, reduce_op=op, prescale_factor=prescale_factor,
                                    postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                                    process_set_id=0)


# The dtypes an eager allreduce hands to the core as host memory (numpy's view of the tensor; the
# op's other dtype, bfloat16, has no numpy type the core knows).
_HOST_DTYPES = frozenset(d.as_datatype_enum for d in (tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64,
                                                       tf.float16, tf.float32, tf.float64))
# Up to this size the host path is the faster: above it, the copy TensorFlow makes of the result
# array costs more than the op's dispatch (at 1 rank: 0.5-0.7x the op's time from 4 to 256 KiB,
# 1.3x at 1 MiB, 1.8x at 4 MiB).
_HOST_MAX_BYTES = 256 << 10
# The name the op's eager kernel submits under (its node name: the op's type), so ranks on either
# path pair up.
_EAGER_NAME = "HorovodAllreduce"
# A failed op as the kernel reports it (csrc/door.cc, to_tf_status), by the core's code name.
_TF_ERRORS = {"mismatch": tf.errors.FailedPreconditionError, "invalid argument": tf.errors.InvalidArgumentError,
              "shut down": tf.errors.AbortedError}


def _host_allreduce(tensor, a, op, prescale_factor, postscale_factor):
    """The eager allreduce of a host tensor without TensorFlow's op dispatch (~7-12 us per op on
    2 cores): the core reduces ``a``, numpy's view of the tensor, into a fresh array that becomes
    the result tensor (a copy), on the tensor's device. Errors are the TensorFlow errors the op
    raises."""
    out = np.empty_like(a)
    key = (_engine.Kind.ALLREDUCE, op, prescale_factor, postscale_factor, 0, 0)
    req = _engine.cached_request(key) or _engine.request(*key)
    core = _engine.current().core
    try:
        h = core.submit(req, _EAGER_NAME, _engine.describe(a, out))
    except ValueError as e:  # refused on this rank (the kernel's submit-time errors)
        raise tf.errors.InvalidArgumentError(None, None, str(e)) from None
    r = core.wait(h, -1)
    if r is not None and not r.ok:
        raise _TF_ERRORS.get(r.code, tf.errors.UnknownError)(None, None, r.message)
    return _tf_ops.EagerTensor(out, tensor.device, tensor._datatype_enum())


def raw_grouped_allreduce(tensors, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
                       ignore_name_scope=False, process_set=global_process_set):
    """Each of ``tensors`` reduced as by ``_allreduce``, negotiated and run as one group."""
    if name is None and not _executing_eagerly():
        name = _normalize_name("HorovodGroupedAllreduce_%s_%s" % (tensors[0].name, tensors[-1].name))
    return _lib().horovod_grouped_allreduce(tensors, name=name, reduce_op=op, prescale_factor=prescale_factor,
                                            postscale_factor=postscale_factor,
                                            ignore_name_scope=ignore_name_scope,
                                            process_set_id=_set_id(process_set))


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """The ranks' tensors concatenated along the first dimension (which may differ per rank)."""
    if name is None and not _executing_eagerly():
        name = "HorovodAllgather_%s" % _normalize_name(tensor.name)
    return _lib().horovod_allgather(tensor, name=name, ignore_name_scope=ignore_name_scope,
                                    process_set_id=_set_id(process_set))


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Each of ``tensors`` gathered as by ``allgather``, negotiated and run as one group (one dtype)."""
    if not tensors:
        return tensors
    if name is None and not _executing_eagerly():
        name = _normalize_name("HorovodGroupedAllgather_%s_%s" % (tensors[0].name, tensors[-1].name))
    return _lib().horovod_grouped_allgather(tensors, name=name, ignore_name_scope=ignore_name_scope,
                                            process_set_id=_set_id(process_set))


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """``root_rank``'s tensor on every rank (``root_rank`` a job rank, as in Horovod)."""
    if name is None and not _executing_eagerly():
        name = "HorovodBroadcast_%s" % _normalize_name(tensor.name)
    return _lib().horovod_broadcast(tensor, name=name, root_rank=_ps.root_of(process_set, root_rank),
                                    ignore_name_scope=ignore_name_scope, process_set_id=_set_id(process_set))


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Rows of ``tensor`` sent to each rank (``splits[i]`` rows to rank i of the set; None: an
    even split), the rows received concatenated in rank order. With ``splits``: (output, the
    rows received from each rank); without: the output alone, as Horovod's."""
    given = splits
    splits = tf.convert_to_tensor(splits, dtype=tf.int32) if splits is not None else tf.constant([], dtype=tf.int32)
    if name is None and not _executing_eagerly():
        name = "HorovodAlltoall_%s" % _normalize_name(tensor.name)
    output, received = _lib().horovod_alltoall(tensor, splits=splits, name=name, ignore_name_scope=ignore_name_scope,
                                               process_set_id=_set_id(process_set))
    return (output, received) if given is not None else output


def raw_reducescatter(tensor, name=None, op=Sum, ignore_name_scope=False, process_set=global_process_set,
                      prescale_factor=1.0, postscale_factor=1.0):
    """This rank's share of ``tensor`` reduced over the set (rows split as evenly as possible,
    the first ranks taking one more)."""
    if name is None and not _executing_eagerly():
        name = "HorovodReducescatter_%s" % _normalize_name(tensor.name)
    return _lib().horovod_reducescatter(tensor, name=name, reduce_op=op, ignore_name_scope=ignore_name_scope,
                                        process_set_id=_set_id(process_set), prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor)


def raw_grouped_reducescatter(tensors, name=None, op=Sum, ignore_name_scope=False, process_set=global_process_set,
                              prescale_factor=1.0, postscale_factor=1.0):
    """Each of ``tensors`` reduce-scattered as by ``raw_reducescatter``, negotiated and run as one
    group (one dtype)."""
    if name is None and not _executing_eagerly():
        name = _normalize_name("HorovodGroupedReducescatter_%s_%s" % (tensors[0].name, tensors[-1].name))
    return _lib().horovod_grouped_reducescatter(tensors, name=name, reduce_op=op, ignore_name_scope=ignore_name_scope,
                                                process_set_id=_set_id(process_set), prescale_factor=prescale_factor,
                                                postscale_factor=postscale_factor)


def join():
    """This rank has no more work: it joins every collective the others still run with zeros
    until all have joined. Returns the last rank to join (an int32 tensor)."""
    _api.size()  # ValueError before init
    return _lib().horovod_join()


# Horovod's names
_allreduce, _grouped_allreduce, _reducescatter = raw_allreduce, raw_grouped_allreduce, raw_reducescatter
_grouped_reducescatter = raw_grouped_reducescatter


# --- the scalar ops: values when the graph runs --------------------------------------------------
def size_op(process_set_id=0, name=None):
    """The size of the process set, as an int32 op."""
    return _lib().horovod_size(process_set_id=process_set_id, name=name)


def local_size_op(name=None):
    return _lib().horovod_local_size(name=name)


def rank_op(process_set_id=0, name=None):
    """This rank within the process set, as an int32 op."""
    return _lib().horovod_rank(process_set_id=process_set_id, name=name)


def local_rank_op(name=None):
    return _lib().horovod_local_rank(name=name)


def process_set_included_op(process_set_id=0, name=None):
    """1 when this rank is in the process set, else 0, as an int32 op."""
    return _lib().horovod_process_set_included(process_set_id=process_set_id, name=name)


# --- gradients ------------------------------------------------------------------------------------
def _set_of(op) -> ProcessSet:
    return _ps.by_id(op.get_attr("process_set_id"))


@_tf_ops.RegisterGradient("HorovodAllreduce")
def _allreduce_grad(op, grad):
    return _allreduce(grad, op=op.get_attr("reduce_op"), prescale_factor=op.get_attr("prescale_factor"),
                      postscale_factor=op.get_attr("postscale_factor"),
                      ignore_name_scope=op.get_attr("ignore_name_scope"), process_set=_set_of(op))


@_tf_ops.RegisterGradient("HorovodGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    return _grouped_allreduce(list(grads), op=op.get_attr("reduce_op"),
                              prescale_factor=op.get_attr("prescale_factor"),
                              postscale_factor=op.get_attr("postscale_factor"),
                              ignore_name_scope=op.get_attr("ignore_name_scope"), process_set=_set_of(op))


@_tf_ops.RegisterGradient("HorovodAllgather")
def _allgather_grad(op, grad):
    ps = _set_of(op)
    ignore = op.get_attr("ignore_name_scope")
    grad = _allreduce(grad, op=Average, ignore_name_scope=ignore, process_set=ps)
    with tf.device("/cpu:0"):
        rows = tf.reshape(tf.shape(op.inputs[0])[0], [1])
        rows = tf.reshape(allgather(rows, ignore_name_scope=ignore, process_set=ps), [ps.size()])
    return tf.split(grad, num_or_size_splits=rows, axis=0)[ps.rank()]


@_tf_ops.RegisterGradient("HorovodGroupedAllgather")
def _grouped_allgather_grad(op, *grads):
    # each member on its own: TensorFlow may hand float32 zeros for a float64 member's gradient
    ps = _set_of(op)
    ignore = op.get_attr("ignore_name_scope")
    grads = [_allreduce(g, op=Average, ignore_name_scope=ignore, process_set=ps) for g in grads]
    out = []
    with tf.device("/cpu:0"):
        rows = [tf.reshape(allgather(tf.reshape(tf.shape(x)[0], [1]), ignore_name_scope=ignore, process_set=ps),
                           [ps.size()]) for x in op.inputs]
    for g, r in zip(grads, rows):
        out.append(tf.split(g, num_or_size_splits=r, axis=0)[ps.rank()])
    return out


@_tf_ops.RegisterGradient("HorovodGroupedReducescatter")
def _grouped_reducescatter_grad(op, *grads):
    ps = _set_of(op)
    scale = float(ps.size()) if op.get_attr("reduce_op") == Sum else 1.0  # the loss is the ranks' mean
    scale *= op.get_attr("prescale_factor") * op.get_attr("postscale_factor")
    ignore = op.get_attr("ignore_name_scope")
    return [allgather(g * scale if scale != 1.0 else g, ignore_name_scope=ignore, process_set=ps) for g in grads]


@_tf_ops.RegisterGradient("HorovodAlltoall")
def _alltoall_grad(op, grad, _grad_received_splits):
    grad, _ = alltoall(grad, splits=op.outputs[1], ignore_name_scope=op.get_attr("ignore_name_scope"),
                       process_set=_set_of(op))
    return [grad, None]


@_tf_ops.RegisterGradient("HorovodReducescatter")
def _reducescatter_grad(op, grad):
    ps = _set_of(op)
    if op.get_attr("reduce_op") == Sum:  # Horovod's convention: the loss is the ranks' mean
        grad *= ps.size()
    for attr in ("prescale_factor", "postscale_factor"):
        if op.get_attr(attr) != 1.0:
            grad *= op.get_attr(attr)
    return allgather(grad, ignore_name_scope=op.get_attr("ignore_name_scope"), process_set=ps)


for _name in ("HorovodSize", "HorovodLocalSize", "HorovodRank", "HorovodLocalRank", "HorovodProcessSetIncluded",
              "HorovodJoin"):
    _tf_ops.NotDifferentiable(_name)


@_tf_ops.RegisterGradient("HorovodBroadcast")
def _broadcast_grad(op, grad):
    ps = _set_of(op)
    reduced = _allreduce(grad, op=Average, ignore_name_scope=op.get_attr("ignore_name_scope"), process_set=ps)
    return reduced if ps.rank() == op.get_attr("root_rank") else reduced * 0
