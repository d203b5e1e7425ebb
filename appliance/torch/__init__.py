"""``horovod.torch``'s API over the appliance's own collective runtime: ``import appliance.torch as hvd``.

The same names, defaults and semantics as Horovod's PyTorch API (``init``, ``allreduce``...,
``DistributedOptimizer``, ``broadcast_parameters``...), executed by ``appliance.runtime``'s C++
core without linking against libtorch: tensors are handed to the core as data pointers.
A script started without a launcher runs as a single rank.

``SyncBatchNorm`` reduces batch statistics over every rank; ``elastic`` (``run``, ``TorchState``,
``ObjectState``, ``ElasticSampler``) runs Horovod elastic scripts on the job's fixed set of hosts
(a lost rank restores the last commit and raises ``HorovodInternalError`` out of ``run``).
``start_timeline``/``stop_timeline`` write Horovod's timeline (rank 0; README "Timeline").
``step``/``progress`` (the appliance's own, not Horovod's) feed the metrics a rank publishes to its
launcher (docs/runtime.md); optimizer steps and elastic commits count themselves.
Environment: read by ``init``
through ``appliance.runtime.config`` only. Errors: ``HorovodInternalError`` (the job failed; names the
rank and host where it started), ``MismatchError`` (ranks disagree on a tensor), ``ValueError``.
"""
from appliance.torch import elastic  # noqa: F401
from appliance.torch.compression import Compression  # noqa: F401
from appliance.torch.functions import (  # noqa: F401
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters,
)
from appliance.torch.mpi_ops import (  # noqa: F401
    Adasum, Average, HorovodInternalError, Max, Min, MismatchError, ProcessSet, Product, Sum, add_process_set,
    allgather, allgather_async, allreduce, allreduce_, allreduce_async, allreduce_async_, alltoall, alltoall_async,
    barrier, broadcast, broadcast_, broadcast_async, broadcast_async_, ccl_built, cross_rank, cross_size,
    cuda_built, ddl_built, global_process_set, gloo_built, gloo_enabled, grouped_allgather,
    grouped_allgather_async, grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
    grouped_allreduce_async_, grouped_reducescatter, grouped_reducescatter_async, init, is_initialized, join,
    local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, poll, rank,
    reducescatter, reducescatter_async, remove_process_set, rocm_built, shutdown, size, sparse_allreduce_async,
    start_timeline, stop_timeline, synchronize,
)
from appliance.torch.optimizer import DistributedOptimizer  # noqa: F401
from appliance.runtime.progress import progress, step  # noqa: F401
from appliance.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401
