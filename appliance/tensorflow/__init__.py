"""``horovod.tensorflow``'s API over the appliance's collective runtime: ``import appliance.tensorflow as hvd``.

The same names, defaults and semantics as Horovod's TensorFlow 2 API, eager and inside
``tf.function`` and ``tf.compat.v1`` graphs: ``init``/``shutdown`` and the layout, ``allreduce``
(an ``IndexedSlices`` as two allgathers, as Horovod does), ``grouped_allreduce``, ``allgather``,
``grouped_allgather``, ``broadcast``, ``broadcast_``, ``reducescatter``, ``grouped_reducescatter``,
``alltoall``, ``join``, ``broadcast_variables``, the scalar ops, ``Compression``,
``DistributedGradientTape`` and ``DistributedOptimizer`` (``tf.compat.v1`` optimizers). The
collectives are asynchronous kernels of an op library compiled against the installed TensorFlow
(``appliance.tensorflow._library``) that submit through the core's C door, so a step's
gradients are in flight together and fuse. One runtime serves the process: torch and
TensorFlow in one script share it.

Environment: read by ``init`` through ``appliance.runtime.config``; ``APPLIANCE_TF_OPS_DIR``
(where the op library is kept). Errors: Python calls before ``init`` raise ``ValueError``;
failures inside ops surface as ``tf.errors`` (``mpi_ops`` says which).
"""
import contextlib

import tensorflow as tf
from tensorflow.python.framework.ops import EagerTensor as _EagerTensor

from appliance.tensorflow.compression import Compression  # noqa: F401
from appliance.tensorflow.functions import (  # noqa: F401
    allgather_object, broadcast_, broadcast_global_variables, broadcast_object, broadcast_object_fn, broadcast_variables,
)
from appliance.tensorflow.functions import BroadcastGlobalVariablesHook  # noqa: F401
from appliance.tensorflow.mpi_ops import (  # noqa: F401
    Adasum, Average, HorovodInternalError, Max, Min, ProcessSet, Product, Sum, add_process_set, allgather,
    grouped_allgather, alltoall, broadcast, join, ccl_built, cross_rank, cross_size, cuda_built, ddl_built, global_process_set, gloo_built,
    gloo_enabled, handle_average_backwards_compatibility, init, is_homogeneous, is_initialized, local_rank,
    local_rank_op, local_size, local_size_op, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built,
    process_set_included_op, rank, rank_op, remove_process_set, rocm_built, shutdown, size, size_op,
    start_timeline, stop_timeline,
)
from appliance.tensorflow.mpi_ops import raw_allreduce, raw_grouped_allreduce, raw_grouped_reducescatter, raw_reducescatter
from appliance.tensorflow.mpi_ops import eager_allreduce as _eager_allreduce
from appliance.tensorflow.mpi_ops import set_size
from appliance.tensorflow.util import executing_eagerly as _executing_eagerly  # noqa: F401  (Horovod's name)


def _on(device):
    """``tf.device(device)``, or nothing for "" (the default: entering tf.device("") costs ~5 us
    per eager op and places nothing)."""
    return tf.device(device) if device else contextlib.nullcontext()


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """``tensor`` (a ``tf.Tensor``, ``tf.Variable`` or ``tf.IndexedSlices``) reduced over the
    ranks; ``op`` defaults to Average. An ``IndexedSlices`` is two allgathers (values and
    indices; Average divides the values by the set's size): Sum and Average only, no scaling."""
    if (type(tensor) is _EagerTensor and process_set is global_process_set and compression is Compression.none
            and not device_dense and average is None):  # the common eager call: the short path
        out = _eager_allreduce(tensor, name, Average if op is None else op, prescale_factor, postscale_factor,
                               ignore_name_scope)
        if out is not None:
            return out
    op = handle_average_backwards_compatibility(op, average)
    n = set_size(process_set)  # ValueError before init, as Horovod's
    if isinstance(tensor, tf.IndexedSlices):
        if op == Adasum:
            raise NotImplementedError("The Adasum reduction does not currently support sparse tensors. As a "
                                      "workaround please pass sparse_as_dense=True to DistributedOptimizer")
        if op not in (Sum, Average):
            raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
        with tf.device(device_sparse):
            values = allgather(tensor.values, process_set=process_set, ignore_name_scope=ignore_name_scope)
            indices = allgather(tensor.indices, process_set=process_set, ignore_name_scope=ignore_name_scope)
            if op == Average:
                values = values / tf.cast(n, values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    with _on(device_dense):
        compressed, ctx = compression.compress(tensor)
        reduced = raw_allreduce(compressed, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                             name=name, process_set=process_set, ignore_name_scope=ignore_name_scope)
        return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set,
                      name=None, ignore_name_scope=False):
    """Each of ``tensors`` reduced as by ``allreduce``, negotiated and run as one group (dense
    tensors of one dtype in one op; ``IndexedSlices`` each as ``allreduce`` does them)."""
    if not tensors:
        return tensors
    op = handle_average_backwards_compatibility(op, average)
    set_size(process_set)  # ValueError before init
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        return [allreduce(t, device_dense=device_dense, device_sparse=device_sparse, compression=compression, op=op,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          process_set=process_set, ignore_name_scope=ignore_name_scope) for t in tensors]
    with _on(device_dense):
        pairs = [compression.compress(t) for t in tensors]
        reduced = raw_grouped_allreduce([p[0] for p in pairs], op=op, prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor, process_set=process_set, name=name,
                                        ignore_name_scope=ignore_name_scope)
        return [compression.decompress(r, p[1]) for r, p in zip(reduced, pairs)]


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0, postscale_factor=1.0):
    """This rank's share of ``tensor`` reduced over the ranks (``op``: Average by default, or
    Sum; rows split as evenly as possible, the first ranks taking one more)."""
    set_size(process_set)  # ValueError before init
    with _on(device_dense):
        compressed, ctx = compression.compress(tensor)
        reduced = raw_reducescatter(compressed, op=op, name=name, process_set=process_set,
                                    ignore_name_scope=ignore_name_scope, prescale_factor=prescale_factor,
                                    postscale_factor=postscale_factor)
        return compression.decompress(reduced, ctx)


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Each of ``tensors`` reduce-scattered as by ``reducescatter``, negotiated and run as one
    group (one dtype)."""
    if not tensors:
        return tensors
    set_size(process_set)  # ValueError before init
    with _on(device_dense):
        pairs = [compression.compress(t) for t in tensors]
        reduced = raw_grouped_reducescatter([p[0] for p in pairs], op=op, process_set=process_set,
                                            prescale_factor=prescale_factor, postscale_factor=postscale_factor)
        return [compression.decompress(r, p[1]) for r, p in zip(reduced, pairs)]


from appliance.tensorflow.optimizer import (  # noqa: E402,F401
    DistributedGradientTape, DistributedOptimizer, PartialDistributedGradientTape,
)
from appliance.tensorflow import gradient_aggregation, gradient_aggregation_eager  # noqa: E402,F401
from appliance.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: E402,F401
from appliance.tensorflow import elastic  # noqa: E402,F401  (hvd.elastic: one module under both names)
