"""The collective runtime, framework-free: Horovod's operations over numpy arrays.

``init()`` joins the job the environment describes (or runs as a single rank without a
launcher). Operations are enqueued by name, negotiated so that every rank runs them in the
same order, and executed by the C++ core (``_core``) on a background thread. Framework
adapters (``appliance.torch``) build on ``appliance.runtime.engine``.

Errors: ``HorovodInternalError`` (job failed; names the origin rank and host),
``MismatchError`` (ranks disagree on a tensor; the runtime stays usable), ``ValueError``.
Knobs: see ``appliance.common.knobs.KNOBS``.
"""
from appliance.runtime.api import (  # noqa: F401
    allgather, allgather_async, allreduce, allreduce_async, alltoall, alltoall_async, barrier,
    broadcast, broadcast_async, cross_rank, cross_size, grouped_allreduce, init, is_homogeneous, is_initialized, join,
    local_rank, local_size, poll, rank, reducescatter, reducescatter_async, shutdown, size,
    start_timeline, stop_timeline, synchronize,
)
from appliance.runtime.engine import Adasum, Average, Max, Min, Product, Sum  # noqa: F401
from appliance.runtime.errors import HorovodInternalError, MismatchError  # noqa: F401
