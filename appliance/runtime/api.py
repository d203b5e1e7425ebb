"""The framework-free API over numpy arrays, and the lifecycle calls (``init``/``shutdown``).

``init()`` reads the environment through ``appliance.runtime.config.RuntimeConfig.from_env``
(HOROVOD_RANK/SIZE..., APPLIANCE_STORE_ADDR, APPLIANCE_JOB_SECRET, APPLIANCE_FAULT_FILE, or
OpenMPI's OMPI_COMM_WORLD_*, or, with none of those, a task ``srun`` started: ``appliance.common.slurm``,
or hydra's PMI_RANK/PMI_SIZE; under mpirun or hydra the store's address and the secret come
through the process manager: ``appliance.runtime.procmgr``)
and starts the process's engine (``appliance.runtime.engine`` owns it; init -> shutdown -> init
works); with none of them the process is a single rank, so a script runs unchanged on a laptop.
In an elastic job (HOROVOD_ELASTIC=1, set by the launcher's driver) the layout comes from the
driver instead, one round at a time (``appliance.runtime.elastic``): ``init()`` waits for its
round, and a round whose rendezvous fails is reported to the driver and the next one taken.

Async ops return a ``_Pending`` handle. The arrays an op reads and writes are held by the
engine's handle table until the core is done with them, so a caller may drop the handle
without ``synchronize``: the result is then lost, never written into freed memory.

Failure modes: ``init()`` raises ``ConfigError`` for a bad environment and HorovodInternalError
when the rendezvous fails (it names the ranks that never arrived) or times out
(HOROVOD_START_TIMEOUT), or when rank 0 of a Slurm step finds the store's derived port taken
(the message names node, port and APPLIANCE_STORE_ADDR), or when a rank under mpirun cannot reach
the store rank 0 published (one line naming both hosts and the interface); every call before ``init()`` raises ValueError, as Horovod does.
``start_timeline``/``stop_timeline`` (and HOROVOD_TIMELINE at init): Horovod's timeline, written
by rank 0 (see README, "Timeline").
"""
from __future__ import annotations

import atexit
import dataclasses
import errno
import os
import socket
import sys
from typing import Optional, Sequence

import numpy as np

from appliance.runtime.config import RuntimeConfig
from appliance.common import knobs
from appliance.runtime import elastic, engine, procmgr
from appliance.runtime.engine import Average, Kind, Result, Sum, describe, request
from appliance.runtime.errors import HorovodInternalError
from appliance.common.slurm import SlurmTask


# --- lifecycle -----------------------------------------------------------------------------
def init(*args, **kwargs) -> None:
    """Join the job described by the environment. A second call is a no-op (as in Horovod)."""
    if engine.is_started():
        return
    if elastic.enabled():
        _init_elastic()
        return
    cfg = RuntimeConfig.from_env(slurm=SlurmTask.from_env, procmgr=procmgr.bootstrap)
    if cfg.options["verbose"] and cfg.rank == 0:
        print("appliance runtime knobs:\n" + knobs.describe(), file=sys.stderr, flush=True)
        if cfg.manager:
            print(f"appliance: under {cfg.manager}, {cfg.store_note}", file=sys.stderr, flush=True)
    try:
        engine.start(cfg)
    except HorovodInternalError as e:
        if cfg.manager:
            raise procmgr.join_error(e, cfg) from None
        if cfg.rank == 0 and cfg.store_note and _port_taken(cfg.store_port):
            raise HorovodInternalError(
                f"rank 0 of {cfg.size} cannot host the rendezvous store: port {cfg.store_port} on "
                f"{cfg.store_host} is already in use ({cfg.store_note})", 0, cfg.host) from None
        raise


def _init_elastic() -> None:
    """An elastic worker's init: the driver's next round, until one starts (``runtime/elastic.py``).
    A round whose rendezvous fails (a member died meanwhile) is reported and the next one asked for."""
    s = elastic.session()
    while True:
        r = s.next_round()
        cfg = dataclasses.replace(RuntimeConfig.from_env(s.round_env(os.environ)), elastic_round=int(r["round"]))
        if cfg.options["verbose"] and cfg.rank == 0 and not s.printed_knobs:
            s.printed_knobs = True
            print("appliance runtime knobs:\n" + knobs.describe(), file=sys.stderr, flush=True)
        try:
            engine.start(cfg)
        except HorovodInternalError as e:
            s.failed(e)
            continue
        s.started()
        return


def _port_taken(port: int) -> bool:
    """Whether another socket listens on ``port`` here (on all addresses or one of them)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


@atexit.register
def shutdown() -> None:
    """Leave the job: pending operations fail, the background thread stops. Idempotent."""
    engine.stop()


def start_timeline(file_path, mark_cycles: bool = False) -> None:
    """Horovod's ``hvd.start_timeline``: rank 0 writes a Chrome-trace file of every tensor's
    negotiation and operation (chrome://tracing, ui.perfetto.dev) until ``stop_timeline`` or
    shutdown; a running timeline is stopped (its file completed) first. Other ranks record
    nothing. ValueError before ``init``, or (rank 0) when ``file_path`` cannot be written."""
    engine.current().start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Horovod's ``hvd.stop_timeline``: close the file (valid JSON from then on). Idempotent."""
    engine.current().stop_timeline()


def is_initialized() -> bool:
    return engine.is_started()


def size() -> int:
    return engine.current().core.size


def rank() -> int:
    return engine.current().core.rank


def local_size() -> int:
    return engine.current().core.local_size


def local_rank() -> int:
    return engine.current().core.local_rank


def cross_size() -> int:
    return engine.current().core.cross_size


def cross_rank() -> int:
    return engine.current().core.cross_rank


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks (judged from this rank's view)."""
    return local_size() * cross_size() == size()


# --- numpy API -----------------------------------------------------------------------------
def _contig(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a))


def _out_like(a: np.ndarray, out: Optional[np.ndarray]) -> np.ndarray:
    """``out`` checked to fit ``a`` (a fresh array when None)."""
    if out is None:
        return np.empty_like(a)
    if not (out.flags.c_contiguous and out.dtype == a.dtype and out.shape == a.shape):
        raise ValueError("out must be a C-contiguous array of the input's dtype and shape")
    return out


def _view(r: Result, dtype) -> np.ndarray:
    return r.output.view(dtype).reshape(r.shape)


class _Pending:
    """Handle of a numpy async op: its engine handle and how to build its result. The arrays
    live in the engine's handle table; dropping this object before ``synchronize`` abandons
    the op (its memory is released once the core completes it)."""

    def __init__(self, e: engine.Engine, handle: int, finish):
        self.engine, self.handle, self.finish = e, handle, finish
        self.waited = False

    def __del__(self):
        if not self.waited:
            try:
                self.engine.abandon(self.handle)
            except Exception:  # noqa: BLE001  (finalizer: never raise)
                pass


def _submit(kind: Kind, name, inp: np.ndarray, out: Optional[np.ndarray], finish, *, op=Sum, prescale=1.0,
            postscale=1.0, root=0, splits=None) -> _Pending:
    e = engine.current()
    h = e.submit(request(kind, op, prescale, postscale, root, splits=splits or ()), name, describe(inp, out),
                 keep=(inp, out))
    return _Pending(e, h, finish)


def poll(h: _Pending) -> bool:
    return h.engine.poll(h.handle)


def synchronize(h: _Pending):
    h.waited = True
    return h.finish(h.engine.wait(h.handle))


def allreduce_async(a, op: int = Average, name: Optional[str] = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, out: Optional[np.ndarray] = None) -> _Pending:
    """``out`` (C-contiguous, same dtype and shape; may be ``a`` itself) receives the result."""
    a = _contig(a)
    out = _out_like(a, out)
    return _submit(Kind.ALLREDUCE, name, a, out, lambda r: out, op=op, prescale=prescale_factor,
                   postscale=postscale_factor)


def allreduce(a, op: int = Average, name: Optional[str] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, out: Optional[np.ndarray] = None) -> np.ndarray:
    a = _contig(a)
    out = _out_like(a, out)
    e = engine.current()  # synchronous: both arrays outlive the operation here, the engine keeps nothing
    e.wait(e.submit(request(Kind.ALLREDUCE, op, prescale_factor, postscale_factor), name, describe(a, out)))
    return out


def grouped_allreduce(arrays: Sequence, op: int = Average, name: Optional[str] = None) -> list:
    """Reduce the arrays as one group (scheduled together); member i is named ``f"{name}.{i}"``."""
    ins = [_contig(a) for a in arrays]
    outs = [np.empty_like(a) for a in ins]
    names = [None if name is None else f"{name}.{i}" for i in range(len(ins))]
    e = engine.current()
    e.wait(e.submit(request(Kind.ALLREDUCE, op), names, [describe(a, o) for a, o in zip(ins, outs)],
                    keep=(ins, outs)))
    return outs


def allgather_async(a, name: Optional[str] = None) -> _Pending:
    a = _contig(a)
    if a.ndim == 0:
        raise ValueError("allgather needs at least one dimension")
    return _submit(Kind.ALLGATHER, name, a, None, lambda r: _view(r, a.dtype))


def allgather(a, name: Optional[str] = None) -> np.ndarray:
    return synchronize(allgather_async(a, name))


def broadcast_async(a, root_rank: int, name: Optional[str] = None, out: Optional[np.ndarray] = None) -> _Pending:
    """``out`` (C-contiguous, same dtype and shape; may be ``a`` itself) receives root's data."""
    a = _contig(a)
    out = _out_like(a, out)
    return _submit(Kind.BROADCAST, name, a, out, lambda r: out, root=root_rank)


def broadcast(a, root_rank: int, name: Optional[str] = None, out: Optional[np.ndarray] = None) -> np.ndarray:
    return synchronize(broadcast_async(a, root_rank, name, out))


def alltoall_async(a, splits: Optional[Sequence[int]] = None, name: Optional[str] = None) -> _Pending:
    a = _contig(a)
    if a.ndim == 0:
        raise ValueError("alltoall needs at least one dimension")
    return _submit(Kind.ALLTOALL, name, a, None, lambda r: (_view(r, a.dtype), np.asarray(r.splits, dtype=np.int64)),
                   splits=splits)


def alltoall(a, splits: Optional[Sequence[int]] = None, name: Optional[str] = None):
    """Returns (output, received_splits)."""
    return synchronize(alltoall_async(a, splits, name))


def reducescatter_async(a, op: int = Average, name: Optional[str] = None, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> _Pending:
    a = _contig(a)
    if a.ndim == 0:
        raise ValueError("reducescatter needs at least one dimension")
    return _submit(Kind.REDUCESCATTER, name, a, None, lambda r: _view(r, a.dtype), op=op,
                   prescale=prescale_factor, postscale=postscale_factor)


def reducescatter(a, op: int = Average, name: Optional[str] = None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> np.ndarray:
    return synchronize(reducescatter_async(a, op, name, prescale_factor, postscale_factor))


def barrier() -> None:
    engine.wait(engine.submit(request(Kind.BARRIER), None))


def join() -> int:
    """Declare this rank out of data; return the last rank that joined (after all have)."""
    return int(engine.wait(engine.submit(request(Kind.JOIN), None)).value)
