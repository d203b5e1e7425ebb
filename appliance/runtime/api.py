"""Process-level runtime state and the framework-free API over numpy arrays.

Owns the one ``_core.Runtime`` of this process (created by ``init()``, destroyed by
``shutdown()``; init -> shutdown -> init works). ``init()`` reads the environment through
``appliance.config.RuntimeConfig.from_env`` (HOROVOD_RANK/SIZE..., APPLIANCE_STORE_ADDR,
APPLIANCE_JOB_SECRET, or OpenMPI's OMPI_COMM_WORLD_*); with none of them the process is a
single rank, so a script runs unchanged on a laptop.

Failure modes: ``init()`` raises ``ConfigError`` for a bad environment and HorovodInternalError
when the rendezvous fails (it names the ranks that never arrived) or times out
(HOROVOD_START_TIMEOUT); every call before ``init()`` raises ValueError, as Horovod does.
"""
from __future__ import annotations

import atexit
import sys
import threading
from typing import Optional, Sequence

import numpy as np

from appliance.config import RuntimeConfig
from appliance.runtime import devices
from appliance.runtime.engine import Average, Buffer, Kind, Result, Sum
from appliance.runtime.errors import HorovodInternalError, MismatchError

_lock = threading.Lock()
_engine: Optional["_Engine"] = None
_generation = 0  # inits so far in this process; part of the job id so a re-init never meets the old store

_ERROR_KINDS = {"mismatch": MismatchError, "invalid argument": ValueError}


class _Engine:
    """Thin Python face of ``_core.Runtime``: names, result conversion, errors."""

    def __init__(self, cfg: RuntimeConfig, generation: int):
        from appliance.runtime import _core

        core_cfg = _core.RuntimeConfig()
        for field in ("rank", "size", "host", "store_host", "store_port", "data_addr",
                      "fusion_threshold", "cycle_time_ms", "cache_capacity", "stall_check_s",
                      "stall_shutdown_s", "chunk_bytes", "heartbeat_timeout_s", "shm", "verbose",
                      "start_timeout_s"):
            setattr(core_cfg, field, getattr(cfg, field))
        core_cfg.secret = cfg.secret
        core_cfg.nccl_library = cfg.nccl_library
        core_cfg.nccl_candidates = devices.nccl_candidates()
        core_cfg.cudart_candidates = devices.cudart_candidates()
        core_cfg.job_id = f"{cfg.job_id}#{generation}"
        self.config = cfg
        try:
            self._rt = _core.Runtime(core_cfg)  # rendezvous happens here (GIL released)
        except _core.CoreError as e:
            raise HorovodInternalError(f"rank {cfg.rank} of {cfg.size} could not join the job: {e}") from None
        self._auto_names = 0
        self._groups = 0

    def submit(self, kind, name, inp, out, *, op, prescale, postscale, root, splits, group):
        if name is None:
            name = f"{Kind(kind).name.lower()}.noname.{self._auto_names}"
            self._auto_names += 1
        def desc(b: Optional[Buffer]):
            if b is None:
                return (0, 0, [], -1, 0)
            return (int(b.ptr), int(b.dtype), [int(d) for d in b.shape], int(b.device), int(b.stream))
        return self._rt.enqueue(int(kind), str(name), desc(inp), desc(out), int(op), float(prescale),
                                float(postscale), int(root), [int(s) for s in (splits or [])],
                                int(group[0]), int(group[1]))

    def poll(self, handle: int) -> bool:
        return self._rt.poll(handle)

    def wait(self, handle: int, stream: Optional[int] = None) -> Result:
        r = self._rt.wait(handle, -1 if stream is None else int(stream))
        if not r.ok:
            exc = _ERROR_KINDS.get(r.code)
            if exc is not None:
                raise exc(r.message)
            raise HorovodInternalError(r.message, r.origin_rank, r.origin_host, r.code)
        return Result(output=r.output, shape=tuple(r.shape), splits=list(r.splits) if r.has_splits else None,
                      value=r.value if r.has_value else None)

    def set_device_allocator(self, fn) -> None:
        self._rt.set_device_allocator(fn)

    def cuda_path(self) -> tuple:
        return tuple(self._rt.cuda_path())

    def new_group_id(self) -> int:
        self._groups += 1
        return self._groups

    def shutdown(self) -> None:
        self._rt.shutdown()


def _runtime() -> _Engine:
    e = _engine
    if e is None:
        raise ValueError("the collective runtime has not been initialized; call hvd.init() first")
    return e


# --- lifecycle -----------------------------------------------------------------------------
def init(*args, **kwargs) -> None:
    """Join the job described by the environment. A second call is a no-op (as in Horovod)."""
    global _engine, _generation
    with _lock:
        if _engine is None:
            _generation += 1
            cfg = RuntimeConfig.from_env()
            if cfg.verbose and cfg.rank == 0:
                from appliance.config import describe
                print("appliance runtime knobs:\n" + describe(), file=sys.stderr, flush=True)
            _engine = _Engine(cfg, _generation)


@atexit.register
def shutdown() -> None:
    """Leave the job: pending operations fail, the background thread stops. Idempotent."""
    global _engine
    with _lock:
        e, _engine = _engine, None
    if e is not None:
        e.shutdown()


def is_initialized() -> bool:
    return _engine is not None


def size() -> int:
    return _runtime()._rt.size


def rank() -> int:
    return _runtime()._rt.rank


def local_size() -> int:
    return _runtime()._rt.local_size


def local_rank() -> int:
    return _runtime()._rt.local_rank


def cross_size() -> int:
    return _runtime()._rt.cross_size


def cross_rank() -> int:
    return _runtime()._rt.cross_rank


# --- numpy API -----------------------------------------------------------------------------
def _contig(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a))


def _view(r: Result, dtype) -> np.ndarray:
    return r.output.view(dtype).reshape(r.shape)


class _Pending:
    """Handle of a numpy async op: keeps arrays alive and knows how to build its result."""

    def __init__(self, handle, keep, finish):
        self.handle, self.keep, self.finish = handle, keep, finish


def poll(h: _Pending) -> bool:
    return _runtime().poll(h.handle)


def synchronize(h: _Pending):
    return h.finish(_runtime().wait(h.handle))


def allreduce_async(a, op: int = Average, name: Optional[str] = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, out: Optional[np.ndarray] = None) -> _Pending:
    """``out`` (C-contiguous, same dtype and shape; may be ``a`` itself) receives the result."""
    a = _contig(a)
    if out is None:
        out = np.empty_like(a)
    elif not (out.flags.c_contiguous and out.dtype == a.dtype and out.shape == a.shape):
        raise ValueError("out must be a C-contiguous array of the input's dtype and shape")
    h = _runtime().submit(Kind.ALLREDUCE, name, Buffer.of_numpy(a), Buffer.of_numpy(out), op=op,
                          prescale=prescale_factor, postscale=postscale_factor, root=0, splits=None,
                          group=(0, 0))
    return _Pending(h, (a, out), lambda r: out)


def allreduce(a, op: int = Average, name: Optional[str] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, out: Optional[np.ndarray] = None) -> np.ndarray:
    return synchronize(allreduce_async(a, op, name, prescale_factor, postscale_factor, out))


def grouped_allreduce(arrays: Sequence, op: int = Average, name: Optional[str] = None) -> list:
    e = _runtime()
    gid = e.new_group_id()
    pend = []
    for i, a in enumerate(arrays):
        a = _contig(a)
        out = np.empty_like(a)
        h = e.submit(Kind.ALLREDUCE, None if name is None else f"{name}.{i}", Buffer.of_numpy(a),
                     Buffer.of_numpy(out), op=op, prescale=1.0, postscale=1.0, root=0, splits=None,
                     group=(gid, len(arrays)))
        pend.append(_Pending(h, (a, out), lambda r, out=out: out))
    return [synchronize(p) for p in pend]


def allgather_async(a, name: Optional[str] = None) -> _Pending:
    a = _contig(a)
    if a.ndim == 0:
        raise ValueError("allgather needs at least one dimension")
    h = _runtime().submit(Kind.ALLGATHER, name, Buffer.of_numpy(a), None, op=Sum, prescale=1.0,
                          postscale=1.0, root=0, splits=None, group=(0, 0))
    return _Pending(h, (a,), lambda r: _view(r, a.dtype))


def allgather(a, name: Optional[str] = None) -> np.ndarray:
    return synchronize(allgather_async(a, name))


def broadcast_async(a, root_rank: int, name: Optional[str] = None) -> _Pending:
    a = _contig(a)
    out = np.empty_like(a)
    h = _runtime().submit(Kind.BROADCAST, name, Buffer.of_numpy(a), Buffer.of_numpy(out), op=Sum,
                          prescale=1.0, postscale=1.0, root=root_rank, splits=None, group=(0, 0))
    return _Pending(h, (a, out), lambda r: out)


def broadcast(a, root_rank: int, name: Optional[str] = None) -> np.ndarray:
    return synchronize(broadcast_async(a, root_rank, name))


def alltoall_async(a, splits: Optional[Sequence[int]] = None, name: Optional[str] = None) -> _Pending:
    a = _contig(a)
    if a.ndim == 0:
        raise ValueError("alltoall needs at least one dimension")
    h = _runtime().submit(Kind.ALLTOALL, name, Buffer.of_numpy(a), None, op=Sum, prescale=1.0,
                          postscale=1.0, root=0, splits=splits, group=(0, 0))
    return _Pending(h, (a,), lambda r: (_view(r, a.dtype), np.asarray(r.splits, dtype=np.int64)))


def alltoall(a, splits: Optional[Sequence[int]] = None, name: Optional[str] = None):
    """Returns (output, received_splits)."""
    return synchronize(alltoall_async(a, splits, name))


def reducescatter_async(a, op: int = Average, name: Optional[str] = None, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> _Pending:
    a = _contig(a)
    if a.ndim == 0:
        raise ValueError("reducescatter needs at least one dimension")
    h = _runtime().submit(Kind.REDUCESCATTER, name, Buffer.of_numpy(a), None, op=op,
                          prescale=prescale_factor, postscale=postscale_factor, root=0, splits=None,
                          group=(0, 0))
    return _Pending(h, (a,), lambda r: _view(r, a.dtype))


def reducescatter(a, op: int = Average, name: Optional[str] = None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> np.ndarray:
    return synchronize(reducescatter_async(a, op, name, prescale_factor, postscale_factor))


def barrier() -> None:
    e = _runtime()
    e.wait(e.submit(Kind.BARRIER, None, None, None, op=Sum, prescale=1.0, postscale=1.0, root=0,
                    splits=None, group=(0, 0)))


def join() -> int:
    """Declare this rank out of data; return the last rank that joined (after all have)."""
    e = _runtime()
    r = e.wait(e.submit(Kind.JOIN, None, None, None, op=Sum, prescale=1.0, postscale=1.0, root=0,
                        splits=None, group=(0, 0)))
    return int(r.value)
