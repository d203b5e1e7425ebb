"""Stub of ``appliance.runtime._core``, the collective core (C++17, csrc/bindings/bindings.cc).

The production API only (the ``_testing`` hooks are not part of it). ``appliance.runtime.engine``
is its one Python user: everything else goes through that module.

One way in, one way out: ``Runtime.submit`` enqueues an operation (or the members of a group)
described by a ``Request`` and a tensor tuple; ``Runtime.wait`` waits for a handle (or a list of
them). Codes are the core's enums (``DataType``, ``ReduceOp``, ``OpKind``: IntEnums whose values
are the C++ ones). Blocking calls release the GIL.
"""
from __future__ import annotations

import enum
from typing import Callable, Optional, Sequence, Tuple, Union, overload

import numpy as np

WIRE_VERSION: int
# Every engine option (csrc/common/options.h) and its default; a knob feeds one by name.
ENGINE_OPTIONS: dict[str, object]

class CoreError(RuntimeError): ...

class DataType(enum.IntEnum):
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

class ReduceOp(enum.IntEnum):
    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5

class OpKind(enum.IntEnum):
    ALLREDUCE = 0
    ALLGATHER = 1
    BROADCAST = 2
    ALLTOALL = 3
    REDUCESCATTER = 4
    BARRIER = 5
    JOIN = 6

# A tensor of one operation: (data, dtype, shape[, out[, device[, stream]]]). ``data``: address of
# the input; ``out``: address of the output, which has the input's dtype, shape, device and stream
# (0 or absent: none, or the core allocates it: allgather, alltoall, reducescatter; in place: data);
# ``device``: -1 host memory (default), else a CUDA device; ``stream``: the CUDA stream the data is
# ordered on (0: the default stream). ``dtype`` is a DataType (an int of its values is taken too).
Tensor = Union[
    Tuple[int, int, Sequence[int]],
    Tuple[int, int, Sequence[int], int],
    Tuple[int, int, Sequence[int], int, int],
    Tuple[int, int, Sequence[int], int, int, int],
]

class RuntimeConfig:
    """The job's layout and bootstrap, and (generated from common/options.h) every ENGINE_OPTIONS entry
    as a read-write attribute with its default."""

    rank: int
    size: int
    host: str
    store_host: str
    store_port: int
    secret: bytes
    job_id: str
    data_addr: str
    nccl_candidates: list[str]
    cudart_candidates: list[str]
    start_timeout_s: float
    fusion_threshold: int
    fusion_member_bytes: int
    cycle_time_ms: float
    cache_capacity: int
    carry_bytes: int
    negotiation: str
    stall_check_disable: bool
    stall_check_s: float
    stall_shutdown_s: float
    deadlock_s: float
    hierarchical_allreduce: str
    hierarchical_allgather: str
    chunk_bytes: int
    heartbeat_timeout_s: float
    shm: bool
    spin_us: int
    verbose: bool
    nccl_library: str
    fault_file: str
    timeline: str
    timeline_mark_cycles: bool
    def __init__(self) -> None: ...

class Request:
    """What every rank must agree on for an operation, less its name and tensor (immutable: one
    object serves every operation with these fields). ``root`` and ``splits`` (alltoall: rows sent
    to each rank; empty: even) speak of the process set's ranks in member order."""

    def __init__(self, kind: OpKind, op: ReduceOp = ReduceOp.SUM, prescale: float = 1.0,
                 postscale: float = 1.0, root: int = 0, splits: Sequence[int] = (),
                 process_set: int = 0) -> None: ...
    @property
    def kind(self) -> OpKind: ...
    @property
    def op(self) -> ReduceOp: ...
    @property
    def prescale(self) -> float: ...
    @property
    def postscale(self) -> float: ...
    @property
    def root(self) -> int: ...
    @property
    def splits(self) -> list[int]: ...
    @property
    def process_set(self) -> int: ...

class Result:
    """What a finished operation hands back: its failure (``ok`` False: ``code`` "mismatch",
    "invalid argument", "peer lost"..., the origin rank and host, the message), or its output."""

    ok: bool
    code: str
    origin_rank: int
    origin_host: str
    message: str
    # flat uint8 array the core allocated (allgather, alltoall, reducescatter), or on the NCCL
    # path the owner the device allocator returned; None otherwise
    output: object
    shape: tuple[int, ...]        # output shape in elements
    splits: Optional[list[int]]   # alltoall: rows received from each rank
    value: Optional[int]          # join: the last rank that joined

class Runtime:
    def __init__(self, config: RuntimeConfig) -> None:
        """Rendezvous and links (GIL released); CoreError when the job cannot be joined."""
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def local_size(self) -> int: ...
    @property
    def cross_rank(self) -> int: ...
    @property
    def cross_size(self) -> int: ...
    def host_of(self, rank: int) -> str: ...
    def link_kind(self, rank: int) -> str:
        """Transport of the data link to ``rank``: "shm", "tcp" ("self" for this rank)."""
    @overload
    def submit(self, request: Request, name: Optional[str], tensor: Optional[Tensor] = None) -> int: ...
    @overload
    def submit(self, request: Request, name: list[Optional[str]], tensor: list[Tensor]) -> list[int]: ...
    def submit(self, request, name, tensor=None):
        """Enqueue one operation (``name`` None: "<kind>.noname.<n>"; ``tensor`` None: no data,
        a barrier or a host join) and return its handle. With a list of names and a list of as
        many tensors: the members of one new group (ids numbered by the core per process set),
        read first, then enqueued in order, in one call; their handles. ValueError when an
        operation is refused here (a name in flight, a bad argument, not a member of the set);
        for a group it carries ``.handles``, the members enqueued before the refused one, whose
        memory must stay alive until they are waited for. TypeError for a malformed tensor."""
    def wait(self, handle: Union[int, Sequence[int]], stream: int = -1) -> Union[None, Result, list]:
        """Block until ``handle`` completes, and forget it (GIL released once). Returns None when
        it succeeded with nothing to hand back (allreduce, broadcast, barrier), else its
        ``Result`` (a failure, or an output). For a list: every handle is waited for, even after
        one failed (their memory is in use until then); the first failure's Result, else None
        when none hands anything back, else a list of None/Result per handle. ``stream`` >= 0 (a
        CUDA stream): device work returns once queued, with ``stream`` made to wait for it.
        ValueError for a handle that is not in flight."""
    def poll(self, handle: Union[int, Sequence[int]]) -> bool:
        """True when the operation (every operation of a list) has completed; never blocks."""
    def add_process_set(self, id: int, ranks: Sequence[int]) -> None: ...
    def remove_process_set(self, id: int) -> None: ...
    def stats(self) -> dict[str, int]:
        """Counters: plans, entries, tensors, fused_entries, ready_full, ready_ids, driven_plans,
        outputs_reused, outputs_idle_bytes; ctrl_in, ctrl_out (control frames received, sent);
        carried (allreduces completed from a result carried with their plan); data_frames (DATA
        frames sent on the data links);
        store_requests (this rank's), store_served (rank 0: its store server's); negotiation_ns,
        negotiation_turns (with ``set_profiling(True)``: CPU time of the engine's negotiation)."""
    def metrics(self) -> dict:
        """What the rank publishes (``appliance.runtime.metrics``), cumulative since this Runtime
        started: ``ops`` {kind: {"n", "bytes", "s"}} for the kinds run here (allreduce, allgather,
        broadcast, alltoall, reducescatter; bytes as nccl-tests sizes them: allgather its output;
        s from launch to completion), ``busy_s`` (callers blocked in ``wait``), ``wait_s`` (the
        part of it before the awaited operations were negotiated), ``late_s`` (how long the
        others waited for this rank, as the coordinator saw it)."""
    def set_profiling(self, on: bool) -> None:
        """Measure the negotiation's CPU time into ``stats()`` (two clock reads per engine turn)."""
    def set_device_allocator(self, fn: Callable[[int, int, int], Tuple[int, object]]) -> None:
        """``fn(device, nbytes, stream) -> (data_ptr, owner)``: CUDA memory for the outputs the
        core sizes (NCCL path), called on the background thread."""
    def cuda_path(self) -> Tuple[str, str]:
        """("nccl" | "staging" | "", why)."""
    def start_timeline(self, path: str, mark_cycles: bool = False) -> None: ...
    def stop_timeline(self) -> None: ...
    def shutdown(self) -> None:
        """Stop; every pending handle fails. Idempotent."""

def c_api() -> object:
    """The C door (csrc/capi/appliance_core.h): a PyCapsule named "appliance_core_api" holding
    the ``appliance_core_api`` table, for framework op libraries (appliance/tensorflow)."""

def set_process_runtime(runtime: Optional[Runtime]) -> None:
    """The runtime the C door reaches (None: none); appliance.runtime.engine sets it."""

def address(obj: object) -> int:
    """Data address of a contiguous buffer (a numpy array)."""

def capabilities(nccl_library: str, nccl_candidates: Sequence[str], cudart_candidates: Sequence[str]) -> dict:
    """What executes here: cuda, cuda_devices, cuda_runtime, cuda_runtime_version, nccl,
    nccl_version, nccl_library, why."""
