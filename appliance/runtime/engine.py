"""The process's collective engine: its one ``_core.Runtime`` and the calls adapters make on it.

Owns the process state: the ``Engine`` (created by ``start()``, destroyed by ``stop()``;
start -> stop -> start works), which ``current()`` returns. ``appliance.runtime.api`` (the numpy
API and ``init``/``shutdown``) and the framework adapters (``appliance.torch``) build on this
module; it imports neither. Config comes from ``appliance.runtime.config.RuntimeConfig`` (the caller
reads the environment: HOROVOD_RANK/SIZE..., APPLIANCE_STORE_ADDR, APPLIANCE_JOB_SECRET,
APPLIANCE_FAULT_FILE, HOROVOD_TIMELINE...). The Horovod timeline (``start_timeline``) is written by
the core on rank 0 (csrc/engine/timeline.h).

Adapters describe tensors as ``Buffer`` (data pointer, dtype code, shape, device, CUDA
stream); the core reads and writes those pointers from its background thread, so the memory
must stay alive until the core is done. ``submit(..., keep=objs)`` makes the engine's handle
table hold ``objs`` until then: until ``wait`` returns, or, for a handle its caller
abandoned (``abandon``), until the core has completed it. Adapters that keep their tensors
themselves pass nothing.

Failure modes: ``start`` raises HorovodInternalError when the rendezvous fails (it names the
ranks that never arrived); ``current()`` raises ValueError before ``start``, as Horovod does;
HOROVOD_TIMELINE naming a file rank 0 cannot write is one line on stderr, and the job goes on;
``wait`` raises HorovodInternalError (job failed: origin rank and host), MismatchError or
ValueError.

Outputs whose size is known only after negotiation (allgather, alltoall, reducescatter) are
allocated by the core and returned as a flat ``uint8`` numpy array in ``Result.output``, with
``Result.shape`` in elements; adapters view them as their dtype without copying.
"""
from __future__ import annotations

import dataclasses
import enum
import os
import threading
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

from appliance.runtime.config import RuntimeConfig
from appliance.runtime import devices
from appliance.runtime.errors import HorovodInternalError, MismatchError


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


class Buffer(NamedTuple):
    """Memory the core may read or write until the operation completes. A tuple in the order
    the core's ``enqueue`` takes it, so it goes to the core as it is (one per op: cheap)."""

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
        code = _NUMPY.get(a.dtype)
        return cls(_address(a), numpy_dtype_code(a.dtype) if code is None else code, a.shape)


def _address(a: np.ndarray) -> int:
    """Data address of a contiguous array. Replaced by the core's (much cheaper) ``address``
    once an Engine has loaded the core."""
    return a.ctypes.data


@dataclasses.dataclass(frozen=True)
class Result:
    output: object = None  # flat uint8 numpy array the core allocated, or the allocator's owner (CUDA)
    shape: tuple = ()                    # output shape in elements
    splits: Optional[list] = None        # alltoall: rows received from each rank
    value: Optional[int] = None          # join: the last rank that joined


_NOTHING = Result()  # the result of every op whose output is the caller's own memory
_ERROR_KINDS = {"mismatch": MismatchError, "invalid argument": ValueError}
_NO_BUFFER = (0, 0, (), -1, 0)  # no memory (barrier, join; allgather's output the core allocates)
_NO_SPLITS: tuple = ()


class Engine:
    """Thin Python face of ``_core.Runtime``: names, result conversion, errors, and the table of
    objects the core may still be using (``keep``)."""

    def __init__(self, cfg: RuntimeConfig, generation: int):
        from appliance.runtime import _core

        global _address
        _address = _core.address
        core_cfg = _core.RuntimeConfig()
        for field in ("rank", "size", "host", "store_host", "store_port", "data_addr",
                      "fusion_threshold", "cycle_time_ms", "cache_capacity", "stall_check_s",
                      "stall_shutdown_s", "chunk_bytes", "heartbeat_timeout_s", "shm", "spin_us", "caller_drives", "verbose",
                      "start_timeout_s", "fault_file"):
            setattr(core_cfg, field, getattr(cfg, field))
        core_cfg.secret = cfg.secret
        core_cfg.nccl_library = cfg.nccl_library
        core_cfg.nccl_candidates = devices.nccl_candidates()
        core_cfg.cudart_candidates = devices.cudart_candidates()
        # A fresh id per start, so a restart never meets an old store; an elastic round's id is
        # the same on every member, however many starts each has behind it.
        core_cfg.job_id = cfg.job_id if cfg.elastic_round else f"{cfg.job_id}#{generation}"
        # rank 0 records from init (a path it cannot write: one line on stderr, the job goes on)
        core_cfg.timeline = "" if cfg.timeline.upper() == "DYNAMIC" else cfg.timeline
        core_cfg.timeline_mark_cycles = cfg.timeline_mark_cycles
        self.config = cfg
        try:
            self.core = _core.Runtime(core_cfg)  # rendezvous happens here (GIL released)
        except _core.CoreError as e:
            raise HorovodInternalError(f"rank {cfg.rank} of {cfg.size} could not join the job: {e}") from None
        self._groups: dict[int, int] = {}  # process set id -> group ids used
        self._sequences: dict = {}          # next_in_sequence
        self._mu = threading.Lock()
        self._keep: dict[int, Any] = {}     # handle -> objects whose memory the core may use
        self._abandoned: set[int] = set()   # handles nobody will wait for

    def submit(self, kind, name, inp, out, *, op, prescale, postscale, root, splits, group, keep=None,
               process_set: int = 0) -> int:
        if self._abandoned:
            self.reap()
        if name is None:
            name = ""  # the core names it "<kind>.noname.<n>", counting per process set
        # Buffers are (ptr, dtype, shape, device, stream) tuples of ints, as enqueue takes them.
        h = self.core.enqueue(int(kind), str(name), _NO_BUFFER if inp is None else inp,
                              _NO_BUFFER if out is None else out, int(op), float(prescale),
                              float(postscale), int(root), [int(s) for s in splits] if splits else _NO_SPLITS,
                              int(group[0]), int(group[1]), int(process_set))
        if keep is not None:
            with self._mu:
                self._keep[h] = keep
        return h

    def allreduce_host(self, name: Optional[str], ptr: int, out_ptr: int, dtype: int, shape, op: int,
                       prescale: float, postscale: float, group_id: int = 0, group_size: int = 0) -> int:
        """``submit`` for the commonest call, kept short (a backward pass makes one per
        gradient): an allreduce of host memory (``out_ptr`` may be ``ptr``) over every rank,
        nothing kept: the caller keeps both memories alive until it has waited."""
        if self._abandoned:
            self.reap()
        return self.core.allreduce_host(name or "", ptr, out_ptr, dtype, shape, op, prescale, postscale, group_id,
                                        group_size)

    def allreduce_host_group(self, names: Sequence[str], ptrs: Sequence[int], dtypes: Sequence[int], shapes,
                             op: int, prescale: float, postscale: float, group_id: int) -> list:
        """``allreduce_host`` in place of every member of one group (``group_id`` from
        ``new_group_id``; member i named ``names[i]``, "" for an automatic name), in one core
        call; returns the handles. When a member is refused, ValueError carries the handles of
        the members enqueued before it (``.handles``): their memory must stay alive until waited."""
        if self._abandoned:
            self.reap()
        handles, why = self.core.allreduce_host_group(names, ptrs, dtypes, shapes, op, prescale, postscale, group_id)
        if why is not None:
            e = ValueError(why)
            e.handles = handles
            raise e
        return handles

    def wait_host(self, handle: int) -> None:
        """``wait`` for an operation submitted by ``allreduce_host`` (nothing to hand back)."""
        r = self.core.wait_host(handle)
        if r is not None:
            self._raise(r)

    def wait_host_all(self, handles: Sequence[int]) -> None:
        """``wait_host`` for each of ``handles`` in one call (the GIL released once): every one is
        waited for, even after one failed; then the first failure is raised."""
        r = self.core.wait_host_all(handles)
        if r is not None:
            self._raise(r)

    def poll(self, handle: int) -> bool:
        return self.core.poll(handle)

    def wait(self, handle: int, stream: Optional[int] = None) -> Result:
        try:
            r = self.core.wait(handle, -1 if stream is None else int(stream))
        finally:
            if handle in self._keep:  # the core is done with the handle's memory
                with self._mu:
                    self._keep.pop(handle, None)
        if not r.ok:
            self._raise(r)
        if r.output is None and not r.has_splits and not r.has_value:
            return _NOTHING  # allreduce, broadcast, barrier: nothing to hand back, no object to build
        return Result(output=r.output, shape=tuple(r.shape), splits=list(r.splits) if r.has_splits else None,
                      value=r.value if r.has_value else None)

    @staticmethod
    def _raise(r) -> None:
        exc = _ERROR_KINDS.get(r.code)
        if exc is not None:
            raise exc(r.message)
        raise HorovodInternalError(r.message, r.origin_rank, r.origin_host, r.code)

    def abandon(self, handle: int) -> None:
        """Nobody will wait for ``handle``: release what it keeps once the core completes it.
        Safe from finalizers (only records the handle)."""
        self._abandoned.add(handle)

    def reap(self) -> None:
        """Forget abandoned handles the core has completed, releasing their memory."""
        for h in list(self._abandoned):
            if self.core.poll(h):
                self._abandoned.discard(h)
                try:
                    self.core.wait(h, -1)  # done: returns at once; frees the handle and its name
                except Exception:  # noqa: BLE001  (nobody wants this result)
                    pass
                with self._mu:
                    self._keep.pop(h, None)

    def kept(self) -> int:
        """Handles whose objects the table still holds (for tests and diagnostics)."""
        with self._mu:
            return len(self._keep)

    def set_device_allocator(self, fn) -> None:
        self.core.set_device_allocator(fn)

    def cuda_path(self) -> tuple:
        return tuple(self.core.cuda_path())

    def next_in_sequence(self, key) -> int:
        """0, 1, 2... per ``key`` for this runtime: names for helpers that issue several operations
        (``broadcast_object``...), the same on every rank that makes the same calls."""
        n = self._sequences.get(key, 0)
        self._sequences[key] = n + 1
        return n

    def add_process_set(self, set_id: int, ranks: Sequence[int]) -> None:
        """Register a set in the core (``appliance.runtime.process_sets`` makes it collective); its
        automatic names and group ids start afresh, so a reused id agrees on its new members."""
        self.core.add_process_set(int(set_id), [int(r) for r in ranks])
        self._groups.pop(int(set_id), None)

    def remove_process_set(self, set_id: int) -> None:
        self.core.remove_process_set(int(set_id))

    def new_group_id(self, process_set: int = 0) -> int:
        self._groups[process_set] = self._groups.get(process_set, 0) + 1
        return self._groups[process_set]

    def start_timeline(self, file_path, mark_cycles: bool = False) -> None:
        """Rank 0 starts writing the timeline to ``file_path`` (stopping a running one first);
        other ranks do nothing. ValueError naming the path when rank 0 cannot write it."""
        self.core.start_timeline(os.fspath(file_path), bool(mark_cycles))

    def stop_timeline(self) -> None:
        """Close the timeline file (complete JSON from then on). Idempotent."""
        self.core.stop_timeline()

    def shutdown(self) -> None:
        self.core.shutdown()  # every pending handle completes (fails): the core uses no memory now
        with self._mu:
            self._keep.clear()
        self._abandoned.clear()


# --- process state ---------------------------------------------------------------------------
_lock = threading.Lock()
_engine: Optional[Engine] = None
_generation = 0  # starts so far in this process; part of the job id so a restart never meets the old store


def start(cfg: RuntimeConfig) -> bool:
    """Create the process's engine from ``cfg`` unless one exists; True when it was created."""
    global _engine, _generation
    with _lock:
        if _engine is not None:
            return False
        _generation += 1
        _engine = Engine(cfg, _generation)
        return True


def stop() -> None:
    """Destroy the process's engine (pending operations fail). Idempotent."""
    global _engine
    with _lock:
        e, _engine = _engine, None
    if e is not None:
        e.shutdown()


def is_started() -> bool:
    return _engine is not None


def current() -> Engine:
    """The process's engine; ValueError before ``start`` (``hvd.init()``)."""
    e = _engine
    if e is None:
        raise ValueError("the collective runtime has not been initialized; call hvd.init() first")
    return e


# --- the calls adapters make ------------------------------------------------------------------
def submit(kind: Kind, name: Optional[str], inp: Optional[Buffer] = None, out: Optional[Buffer] = None, *,
           op: int = Sum, prescale: float = 1.0, postscale: float = 1.0, root: int = 0,
           splits: Optional[Sequence[int]] = None, group: tuple = (0, 0), keep: Any = None,
           process_set: int = 0) -> int:
    """Enqueue one operation; return its handle. ``name`` None gets an automatic name.

    allreduce: ``out`` (same dtype/shape as ``inp``, may be ``inp``) receives the reduction.
    broadcast: ``out`` (may be ``inp``) receives root's data. allgather/alltoall/reducescatter:
    ``out`` is None; see ``Result``. ``group`` = (group id, number of members) makes the core
    schedule the members together (grouped_allreduce). ``keep``: objects (host memory) the
    engine holds until the core is done with the handle. ``process_set``: the id of a set added
    with ``add_process_set`` (0 = every rank); ``root`` and ``splits`` then speak of the set's
    ranks in member order. Raises ValueError when ``name`` is in flight or this rank is not in
    the set, HorovodInternalError when the job has failed.
    """
    return current().submit(kind, name, inp, out, op=op, prescale=prescale, postscale=postscale,
                            root=root, splits=splits, group=group, keep=keep, process_set=process_set)


def poll(handle: int) -> bool:
    """True when ``handle`` has completed (successfully or not); never blocks."""
    return current().poll(handle)


def wait(handle: int, stream: Optional[int] = None) -> Result:
    """Block (GIL released) until ``handle`` completes; return its Result or raise its error.

    ``stream`` (a CUDA stream handle, 0 = the default stream): for device work, return as soon
    as it is queued on its stream and ``stream`` has been made to wait for it (torch's
    ``Work.synchronize`` semantics), instead of blocking the host until it finished; an error
    of that work then reaches the job as an abort. Host work is always waited for."""
    return current().wait(handle, stream)


def new_group_id(process_set: int = 0) -> int:
    """A fresh id for ``submit(group=...)``; the same sequence on every member of the set."""
    return current().new_group_id(process_set)


def link_kinds() -> list:
    """Transport of this rank's data link to every rank: "shm", "tcp" ("self" for this rank)."""
    core = current().core
    return [core.link_kind(r) for r in range(core.size)]


def capabilities() -> dict:
    """What executes here: see ``appliance.runtime.devices`` (cuda, nccl, nccl_version, why...)."""
    return devices.capabilities()


def set_device_allocator(fn) -> None:
    """``fn(device, nbytes, stream) -> (data_ptr, owner)`` supplies CUDA memory for outputs the core
    sizes after negotiation (NCCL path); ``owner`` comes back as ``Result.output``. Called on
    the core's background thread."""
    current().set_device_allocator(fn)


def cuda_path() -> tuple:
    """("nccl" | "staging" | "", why): how this job moves CUDA tensors ("" before the first)."""
    return current().cuda_path()
