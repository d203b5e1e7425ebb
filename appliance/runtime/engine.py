"""The process's collective engine, as framework adapters see it.

One ``_core.Runtime`` per initialised process (owned by the module-level ``_state`` of
``appliance.runtime.api``; this module is stateless). Adapters describe tensors as ``Buffer``
(data pointer, dtype code, shape, device, CUDA stream) and keep the tensors alive themselves
until ``wait`` returns: the core reads and writes those pointers from its background thread.

Outputs whose size is known only after negotiation (allgather, alltoall, reducescatter) are
allocated by the core and returned as a flat ``uint8`` numpy array in ``Result.output``, with
``Result.shape`` in elements; adapters view them as their dtype without copying.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Optional, Sequence

import numpy as np


class Kind(enum.IntEnum):
    ALLREDUCE = 0
    ALLGATHER = 1
    BROADCAST = 2
    ALLTOALL = 3
    REDUCESCATTER = 4
    BARRIER = 5
    JOIN = 6


class DType(enum.IntEnum):
    UINT8 = 0
    INT8 = 1
    INT16 = 2
    INT32 = 3
    INT64 = 4
    FLOAT16 = 5
    BFLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BOOL = 9


# Reduction ops, with Horovod's values.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5

DTYPE_SIZE = {DType.UINT8: 1, DType.INT8: 1, DType.INT16: 2, DType.INT32: 4, DType.INT64: 8,
              DType.FLOAT16: 2, DType.BFLOAT16: 2, DType.FLOAT32: 4, DType.FLOAT64: 8, DType.BOOL: 1}

_NUMPY = {np.dtype(np.uint8): DType.UINT8, np.dtype(np.int8): DType.INT8, np.dtype(np.int16): DType.INT16,
          np.dtype(np.int32): DType.INT32, np.dtype(np.int64): DType.INT64, np.dtype(np.float16): DType.FLOAT16,
          np.dtype(np.float32): DType.FLOAT32, np.dtype(np.float64): DType.FLOAT64, np.dtype(np.bool_): DType.BOOL}


def numpy_dtype_code(dt) -> DType:
    try:
        return _NUMPY[np.dtype(dt)]
    except KeyError:
        raise TypeError(f"dtype {np.dtype(dt)} is not supported by the collective runtime "
                        f"(supported: {', '.join(str(d) for d in _NUMPY)}, and bfloat16 from torch)") from None


@dataclasses.dataclass(frozen=True)
class Buffer:
    """Memory the core may read or write until the operation completes."""

    ptr: int
    dtype: DType
    shape: tuple
    device: int = -1  # -1 = host memory; otherwise a CUDA device index
    stream: int = 0   # CUDA stream handle the data is ordered on (0 = default stream)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZE[DType(self.dtype)]

    @classmethod
    def of_numpy(cls, a: np.ndarray) -> "Buffer":
        if not a.flags.c_contiguous:
            raise ValueError("the collective runtime needs C-contiguous arrays")
        return cls(a.ctypes.data, numpy_dtype_code(a.dtype), tuple(a.shape))


@dataclasses.dataclass
class Result:
    output: object = None  # flat uint8 numpy array the core allocated, or the allocator's owner (CUDA)
    shape: tuple = ()                    # output shape in elements
    splits: Optional[list] = None        # alltoall: rows received from each rank
    value: Optional[int] = None          # join: the last rank that joined


def submit(kind: Kind, name: Optional[str], inp: Optional[Buffer] = None, out: Optional[Buffer] = None, *,
           op: int = Sum, prescale: float = 1.0, postscale: float = 1.0, root: int = 0,
           splits: Optional[Sequence[int]] = None, group: tuple = (0, 0)) -> int:
    """Enqueue one operation; return its handle. ``name`` None gets an automatic name.

    allreduce: ``out`` (same dtype/shape as ``inp``, may be ``inp``) receives the reduction.
    broadcast: ``out`` (may be ``inp``) receives root's data. allgather/alltoall/reducescatter:
    ``out`` is None; see ``Result``. ``group`` = (group id, number of members) makes the core
    schedule the members together (grouped_allreduce). Raises ValueError when ``name`` is in
    flight, HorovodInternalError when the job has failed.
    """
    from appliance.runtime import api
    return api._runtime().submit(kind, name, inp, out, op=op, prescale=prescale, postscale=postscale,
                                  root=root, splits=splits, group=group)


def poll(handle: int) -> bool:
    """True when ``handle`` has completed (successfully or not); never blocks."""
    from appliance.runtime import api
    return api._runtime().poll(handle)


def wait(handle: int, stream: Optional[int] = None) -> Result:
    """Block (GIL released) until ``handle`` completes; return its Result or raise its error.

    ``stream`` (a CUDA stream handle, 0 = the default stream): for device work, return as soon
    as it is queued on its stream and ``stream`` has been made to wait for it (torch's
    ``Work.synchronize`` semantics), instead of blocking the host until it finished; an error
    of that work then reaches the job as an abort. Host work is always waited for."""
    from appliance.runtime import api
    return api._runtime().wait(handle, stream)


def new_group_id() -> int:
    """A fresh id for ``submit(group=...)``; the same sequence on every rank."""
    from appliance.runtime import api
    return api._runtime().new_group_id()


def capabilities() -> dict:
    """What executes here: see ``appliance.runtime.devices`` (cuda, nccl, nccl_version, why...)."""
    from appliance.runtime import devices
    return devices.capabilities()


def set_device_allocator(fn) -> None:
    """``fn(device, nbytes, stream) -> (data_ptr, owner)`` supplies CUDA memory for outputs the core
    sizes after negotiation (NCCL path); ``owner`` comes back as ``Result.output``. Called on
    the core's background thread."""
    from appliance.runtime import api
    api._runtime().set_device_allocator(fn)


def cuda_path() -> tuple:
    """("nccl" | "staging" | "", why): how this job moves CUDA tensors ("" before the first)."""
    from appliance.runtime import api
    return api._runtime().cuda_path()
