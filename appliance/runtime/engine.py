"""The process's collective engine: its one ``_core.Runtime`` and the calls adapters make on it.

Owns the process state: the ``Engine`` (created by ``start()``, destroyed by ``stop()``;
start -> stop -> start works), which ``current()`` returns. ``appliance.runtime.api`` (the numpy
API and ``init``/``shutdown``) and the framework adapters (``appliance.torch``) build on this
module; it imports neither. Each engine's metrics publisher (``appliance.runtime.metrics``, only with
APPLIANCE_METRICS_ADDR set) starts and stops with it. Config comes from
``appliance.runtime.config.RuntimeConfig`` (the caller
reads the environment: HOROVOD_RANK/SIZE..., APPLIANCE_STORE_ADDR, APPLIANCE_JOB_SECRET, and every
engine knob, which is copied to the core by the option name it feeds). The Horovod timeline
(``start_timeline``) is written by the core on rank 0 (csrc/engine/timeline.h).

One way in and one way out, for every adapter and operation (the core's API: ``_core.pyi``):
``submit(request, name, tensor)`` enqueues an operation, or with lists of names and tensors the
members of one group, and ``wait(handle or handles)`` waits for it. ``request(...)`` gives the
``Request`` (kind, op, scales, root, process set) shared by the operations that agree on those:
built once, reused. A tensor is described by a plain tuple, ``TensorDesc``'s fields in order:
``(data, dtype, shape, out, device, stream)`` (the last three optional). Codes are the core's own
enums: ``DType`` (``_core.DataType``), ``Kind`` (``_core.OpKind``), ``ReduceOp``; Horovod's
``Average``... ``Product`` are their plain int values.

The core reads and writes those pointers from its background thread, so the memory must stay
alive until the core is done. ``submit(..., keep=objs)`` makes the engine's handle table hold
``objs`` until then: until ``wait`` returns, or, for a handle its caller abandoned (``abandon``),
until the core has completed it. Adapters that keep their tensors themselves pass nothing.

Failure modes: ``start`` raises HorovodInternalError when the rendezvous fails (it names the
ranks that never arrived); ``current()`` raises ValueError before ``start``, as Horovod does;
HOROVOD_TIMELINE naming a file rank 0 cannot write is one line on stderr, and the job goes on;
``submit`` raises ValueError for an operation this rank refuses (a name in flight, a bad
argument; a refused group member's ValueError carries the handles of the members enqueued before
it in ``.handles``); ``wait`` raises HorovodInternalError (job failed: origin rank and host),
MismatchError or ValueError.

``wait`` returns None for an operation whose result is the caller's own memory (allreduce,
broadcast, barrier), else a ``Result``; for a list of handles, None or a list of those.
Outputs whose size is known only after negotiation (allgather, alltoall, reducescatter) are
allocated by the core and returned as a flat ``uint8`` numpy array in ``Result.output``, with
``Result.shape`` in elements; adapters view them as their dtype without copying.

A running engine is also the one the core's C door reaches (``_core.set_process_runtime``;
csrc/capi/appliance_core.h), so an op library of another framework (``appliance.tensorflow``)
submits to the same runtime.
"""
from __future__ import annotations

import os
import threading
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

from appliance.runtime import _core
from appliance.runtime import devices, metrics
from appliance.runtime.config import RuntimeConfig
from appliance.runtime.errors import HorovodInternalError, MismatchError

DType = _core.DataType
Kind = _core.OpKind
ReduceOp = _core.ReduceOp
Request = _core.Request
Result = _core.Result

# Reduction ops under Horovod's names, as the plain ints Horovod scripts expect.
Average, Sum, Adasum, Min, Max, Product = (int(ReduceOp.AVERAGE), int(ReduceOp.SUM), int(ReduceOp.ADASUM),
                                           int(ReduceOp.MIN), int(ReduceOp.MAX), int(ReduceOp.PRODUCT))

_NUMPY = {np.dtype(np.uint8): DType.UINT8, np.dtype(np.int8): DType.INT8, np.dtype(np.int16): DType.INT16,
          np.dtype(np.int32): DType.INT32, np.dtype(np.int64): DType.INT64, np.dtype(np.float16): DType.FLOAT16,
          np.dtype(np.float32): DType.FLOAT32, np.dtype(np.float64): DType.FLOAT64, np.dtype(np.bool_): DType.BOOL}

# Address of a contiguous buffer (a numpy array); much cheaper than numpy's ``.ctypes.data``.
address = _core.address
# The core's C door for framework op libraries: a PyCapsule "appliance_core_api" (csrc/capi).
c_api = _core.c_api


def numpy_dtype(dt) -> DType:
    """The core's element type for a numpy dtype; TypeError naming the supported ones."""
    try:
        return _NUMPY[np.dtype(dt)]
    except KeyError:
        raise TypeError(f"dtype {np.dtype(dt)} is not supported by the collective runtime "
                        f"(supported: {', '.join(str(d) for d in _NUMPY)}, and bfloat16 from torch)") from None


class TensorDesc(NamedTuple):
    """One tensor of an operation, as ``submit`` takes it (a plain tuple in this order works
    the same, and is what the per-op paths build)."""

    data: int         # address of the input
    dtype: DType
    shape: tuple
    out: int = 0      # address of the output (same dtype, shape, device); 0: none, or allocated by the core
    device: int = -1  # -1 = host memory; otherwise a CUDA device index
    stream: int = 0   # CUDA stream handle the data is ordered on (0 = the default stream)


def describe(a: np.ndarray, out: Optional[np.ndarray] = None) -> tuple:
    """A C-contiguous numpy array (and the array receiving the result, if any) as ``submit``
    takes them."""
    if not a.flags.c_contiguous:
        raise ValueError("the collective runtime needs C-contiguous arrays")
    code = _NUMPY.get(a.dtype)
    return (address(a), numpy_dtype(a.dtype) if code is None else code, a.shape,
            0 if out is None else address(out))


_requests: dict = {}  # (kind, op, prescale, postscale, root, process set) -> Request: the one cache
_REQUESTS_MAX = 4096  # scale factors may change every step (a schedule): the cache starts over
# The cached Request for a key ``(kind, op, prescale, postscale, root, process_set)`` as ``request``
# files it (``op`` as the caller gave it), or None: the per-op paths' lookup without a call of ``request``.
cached_request = _requests.get


def request(kind: Kind, op: int = Sum, prescale: float = 1.0, postscale: float = 1.0, root: int = 0,
            process_set: int = 0, splits: Sequence[int] = ()) -> Request:
    """The ``Request`` for these arguments: one object per combination, built once (without
    ``splits``). ``op`` is a ``ReduceOp`` or Horovod's int; ValueError for an unknown one."""
    key = (kind, op, prescale, postscale, root, process_set)
    r = None if splits else _requests.get(key)
    if r is None:
        try:
            code = ReduceOp(op)
        except ValueError:
            raise ValueError(f"unknown reduce op {op!r} (use Average, Sum, Adasum, Min, Max or Product)") from None
        r = Request(kind, code, float(prescale), float(postscale), int(root), [int(s) for s in splits],
                    int(process_set))
        if not splits:
            if len(_requests) >= _REQUESTS_MAX:
                _requests.clear()
            _requests[key] = r
    return r


_ERROR_KINDS = {"mismatch": MismatchError, "invalid argument": ValueError}


class Engine:
    """Thin Python face of ``_core.Runtime``: config, errors, and the table of objects the core
    may still be using (``keep``)."""

    def __init__(self, cfg: RuntimeConfig, generation: int):
        core_cfg = _core.RuntimeConfig()
        for field in ("rank", "size", "host", "store_host", "store_port", "secret", "data_addr"):
            setattr(core_cfg, field, getattr(cfg, field))
        # A fresh id per start, so a restart never meets an old store; an elastic round's id is
        # the same on every member, however many starts each has behind it.
        core_cfg.job_id = cfg.job_id if cfg.elastic_round else f"{cfg.job_id}#{generation}"
        core_cfg.nccl_candidates = devices.nccl_candidates()
        core_cfg.cudart_candidates = devices.cudart_candidates()
        for option, value in cfg.options.items():  # every engine knob, by the core option it feeds
            setattr(core_cfg, option, value)
        self.config = cfg
        try:
            self.core = _core.Runtime(core_cfg)  # rendezvous happens here (GIL released)
        except _core.CoreError as e:
            raise HorovodInternalError(f"rank {cfg.rank} of {cfg.size} could not join the job: {e}") from None
        if _device_allocator is not None:
            self.core.set_device_allocator(_device_allocator)
        _core.set_process_runtime(self.core)  # the C door's runtime (csrc/capi): framework op libraries
        self._sequences: dict = {}          # next_in_sequence
        self._mu = threading.Lock()
        self._keep: dict[int, Any] = {}     # handle -> objects whose memory the core may use
        self._abandoned: set[int] = set()   # handles nobody will wait for

    def submit(self, req: Request, name, tensor=None, keep=None):
        """Enqueue one operation (``name`` a str, or None for an automatic name; ``tensor`` a
        ``TensorDesc`` or tuple, None for none) and return its handle; or, with a list of names
        and a list of as many tensors, the members of one new group (scheduled together) and
        their handles. ``keep``: objects the table holds until the core is done with them."""
        if self._abandoned:
            self.reap()
        if keep is None:
            return self.core.submit(req, name, tensor)
        try:
            h = self.core.submit(req, name, tensor)
        except ValueError as e:
            done = getattr(e, "handles", None)  # members of a group enqueued before the refused one
            if done:
                with self._mu:
                    for x in done:
                        self._keep[x] = keep
                self._abandoned.update(done)  # nobody will wait for them: released once complete
            raise
        with self._mu:
            if h.__class__ is int:
                self._keep[h] = keep
            else:
                for x in h:
                    self._keep[x] = keep
        return h

    def wait(self, handle, stream: int = -1):
        """Block (GIL released) until ``handle`` completes, or every handle of a list (each is
        waited for even after one failed: its memory is in use until then); return None when
        there is nothing to hand back, else the Result (a list of them for a list of handles),
        or raise the (first) failure. ``stream`` >= 0 (a CUDA stream handle): for device work,
        return once it is queued and ``stream`` made to wait for it (torch's semantics)."""
        try:
            r = self.core.wait(handle, stream)
        finally:
            if self._keep:  # the core is done with the handles' memory
                with self._mu:
                    if handle.__class__ is int:
                        self._keep.pop(handle, None)
                    else:
                        for x in handle:
                            self._keep.pop(x, None)
        if r is None or r.__class__ is list:
            return r
        if not r.ok:
            self._raise(r)
        return r

    def poll(self, handle) -> bool:
        """True when ``handle`` (or every handle of a list) has completed; never blocks."""
        return self.core.poll(handle)

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
                    self.core.wait(h)  # done: returns at once; frees the handle and its name
                except Exception:  # noqa: BLE001  (nobody wants this result)
                    pass
                with self._mu:
                    self._keep.pop(h, None)

    def kept(self) -> int:
        """Handles whose objects the table still holds (for tests and diagnostics)."""
        with self._mu:
            return len(self._keep)

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

    def remove_process_set(self, set_id: int) -> None:
        self.core.remove_process_set(int(set_id))

    def start_timeline(self, file_path, mark_cycles: bool = False) -> None:
        """Rank 0 starts writing the timeline to ``file_path`` (stopping a running one first);
        other ranks do nothing. ValueError naming the path when rank 0 cannot write it."""
        self.core.start_timeline(os.fspath(file_path), bool(mark_cycles))

    def stop_timeline(self) -> None:
        """Close the timeline file (complete JSON from then on). Idempotent."""
        self.core.stop_timeline()

    def shutdown(self) -> None:
        self.core.shutdown()  # every pending handle completes (fails): the core uses no memory now
        _core.set_process_runtime(None)
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
        metrics.start(_engine)  # with APPLIANCE_METRICS_ADDR set: its publisher (runtime/metrics.py)
        return True


def stop() -> None:
    """Destroy the process's engine (pending operations fail). Idempotent."""
    global _engine
    with _lock:
        e, _engine = _engine, None
    if e is not None:
        metrics.stop(e)
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
def submit(req: Request, name, tensor=None, keep: Any = None):
    """Enqueue one operation, or a group (lists of names and tensors); return its handle(s).

    ``req``: from ``request`` (kind, op, scales, root, process set: ``root`` and the request's
    splits then speak of the set's ranks in member order). ``name`` None gets an automatic name.
    ``tensor``: ``(data, dtype, shape[, out[, device[, stream]]])`` (``TensorDesc``), None for a
    barrier. allreduce: ``out`` (may be ``data``) receives the reduction. broadcast: ``out`` (may
    be ``data``) receives root's data. allgather/alltoall/reducescatter: no ``out``; see
    ``Result``. join: only ``device`` counts (where a joined rank contributes zeros). ``keep``:
    objects (host memory) the engine holds until the core is done with the handle(s). Raises
    ValueError when ``name`` is in flight or this rank is not in the set, HorovodInternalError
    when the job has failed."""
    return current().submit(req, name, tensor, keep)


def poll(handle) -> bool:
    """True when ``handle`` (or every handle of a list) has completed; never blocks."""
    return current().poll(handle)


def wait(handle, stream: Optional[int] = None):
    """Block (GIL released) until ``handle`` (or every handle of a list) completes; return None
    (nothing to hand back: allreduce, broadcast, barrier), its Result, or a list of those for a
    list; raise its error.

    ``stream`` (a CUDA stream handle, 0 = the default stream): for device work, return as soon
    as it is queued on its stream and ``stream`` has been made to wait for it (torch's
    ``Work.synchronize`` semantics), instead of blocking the host until it finished; an error
    of that work then reaches the job as an abort. Host work is always waited for."""
    return current().wait(handle, -1 if stream is None else int(stream))


def link_kinds() -> list:
    """Transport of this rank's data link to every rank: "shm", "tcp" ("self" for this rank)."""
    core = current().core
    return [core.link_kind(r) for r in range(core.size)]


def capabilities() -> dict:
    """What executes here: see ``appliance.runtime.devices`` (cuda, nccl, nccl_version, why...)."""
    return devices.capabilities()


_device_allocator = None  # given to every engine at its start (use_device_allocator)


def use_device_allocator(fn) -> None:
    """``fn(device, nbytes, stream) -> (data_ptr, owner)`` supplies CUDA memory for outputs the
    core sizes after negotiation (NCCL path); ``owner`` comes back as ``Result.output``. Called on
    the core's background thread. Given once (an adapter's init): the running engine gets it now,
    every later one at its start."""
    global _device_allocator
    _device_allocator = fn
    e = _engine
    if e is not None:
        e.core.set_device_allocator(fn)


def cuda_path() -> tuple:
    """("nccl" | "staging" | "", why): how this job moves CUDA tensors ("" before the first)."""
    return current().cuda_path()
