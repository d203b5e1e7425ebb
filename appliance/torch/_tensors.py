"""Torch tensors as the engine sees them, and the table of in-flight handles.

Owns the translation between ``torch.Tensor`` and the core's tensor descriptors
(``appliance.runtime.engine.TensorDesc``: dtype, device, CUDA stream), the one test of the short
path (``host_dtype``: a tensor the core can use as it is), the staging of tensors the core
cannot use directly (non-contiguous ones, and CUDA tensors when the core cannot use CUDA memory
here: a contiguous or host copy is used, with a one-time warning for the latter, and, for
in-place operations, copied back when the operation completes), the device allocator the core
takes CUDA outputs from (torch's caching allocator), the conversion of core-allocated
outputs into tensors without a copy, and ``HandleTable``: Horovod-style integer handles that keep
every tensor the core may touch alive until ``synchronize``. Reads no environment. Failure
modes: ``ValueError`` for an unsupported dtype or device (as Horovod); errors of the operation
itself are raised by ``synchronize``.
"""
from __future__ import annotations

import itertools
import sys
import weakref
from typing import Callable, Optional

import torch

from appliance.runtime import engine
from appliance.runtime.engine import DType

# torch dtype -> the core's element type
HOST_DTYPES = {
    torch.uint8: DType.UINT8, torch.int8: DType.INT8, torch.int16: DType.INT16,
    torch.int32: DType.INT32, torch.int64: DType.INT64, torch.float16: DType.FLOAT16,
    torch.bfloat16: DType.BFLOAT16, torch.float32: DType.FLOAT32, torch.float64: DType.FLOAT64,
    torch.bool: DType.BOOL,
}


def dtype_code(t: torch.Tensor) -> DType:
    try:
        return HOST_DTYPES[t.dtype]
    except KeyError:
        names = ", ".join(str(d).replace("torch.", "") for d in HOST_DTYPES)
        raise ValueError(f"Tensor type {t.dtype} is not supported (supported: {names})") from None


def host_dtype(t: torch.Tensor) -> Optional[DType]:
    """The short path's one test: the core's dtype for ``t`` when the core can read and write
    ``t``'s memory as it is (a contiguous host tensor of a supported dtype), else None (the
    tensor is staged: ``stage``)."""
    return HOST_DTYPES.get(t.dtype) if t.is_cpu and t.is_contiguous() else None


_warned: set = set()
_allocator_of = None  # weak reference to the runtime that has our device allocator


def capabilities() -> dict:
    """What executes here (``appliance.runtime.devices``; asked of the core once per process)."""
    return engine.capabilities()


def _give_allocator() -> None:
    global _allocator_of
    rt = engine.current()
    if _allocator_of is None or _allocator_of() is not rt:
        engine.use_device_allocator(_device_allocator)
        _allocator_of = weakref.ref(rt)


def _warn_once(text: str) -> None:
    if text not in _warned:
        _warned.add(text)
        print(f"appliance: warning: {text}", file=sys.stderr, flush=True)


def _device_allocator(device: int, nbytes: int, stream: int):
    """CUDA memory for outputs the core sizes after negotiation, from torch's allocator, tied to
    the stream the operation writes it on."""
    dev = torch.device("cuda", int(device))
    if stream:
        with torch.cuda.stream(torch.cuda.ExternalStream(int(stream), device=dev)):
            t = torch.empty(int(nbytes), dtype=torch.uint8, device=dev)
    else:
        t = torch.empty(int(nbytes), dtype=torch.uint8, device=dev)
    return t.data_ptr(), t


def stage(t: torch.Tensor) -> torch.Tensor:
    """The tensor the core will read/write in place of ``t`` (``t`` itself when possible).
    CUDA tensors stay on their device when the core can use CUDA memory here (it then runs
    them through NCCL, or through host staging it decides on and announces); otherwise they
    are copied to the host here, with a one-time warning saying why."""
    dtype_code(t)
    w = t.detach()
    if w.is_cpu:  # the common case first: is_cpu is far cheaper than building w.device
        return w if w.is_contiguous() else w.contiguous()
    if w.device.type != "cuda":
        raise ValueError(f"tensors on device {w.device} are not supported (cpu and cuda are)")
    caps = capabilities()
    if caps.get("cuda", False):
        _give_allocator()
    else:
        _warn_once("CUDA tensors go through host memory: the collective core cannot use CUDA memory here ("
                   f"{caps.get('why') or 'no CUDA runtime'})")
        w = w.cpu()
    if not w.is_contiguous():
        w = w.contiguous()
    return w


def describe(w: torch.Tensor, out: Optional[torch.Tensor] = None) -> tuple:
    """A staged tensor (see ``stage``), and the tensor receiving the result if any (same dtype,
    shape and device), as ``engine.submit`` takes them."""
    o = 0 if out is None else out.data_ptr()
    if w.is_cuda:
        stream = torch.cuda.current_stream(w.device).cuda_stream
        return (w.data_ptr(), dtype_code(w), w.shape, o, w.device.index, int(stream))
    return (w.data_ptr(), dtype_code(w), w.shape, o)


def cuda_device(w: torch.Tensor) -> Optional[int]:
    """The CUDA device of a staged tensor (whose stream ``synchronize`` orders), else None."""
    return None if w.is_cpu else w.device.index


def empty_like(w: torch.Tensor) -> torch.Tensor:
    return torch.empty(w.shape, dtype=w.dtype, device=w.device)


def copy_back(user: torch.Tensor, work: torch.Tensor) -> torch.Tensor:
    """After an in-place operation ran on ``work``, make ``user`` hold the result."""
    if work is not user and work.data_ptr() != user.data_ptr():
        with torch.no_grad():
            user.copy_(work)
    return user


def to_device(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return out if out.device == like.device else out.to(like.device)


def from_result(r: engine.Result, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """Core-allocated output (flat uint8 numpy) as a tensor of ``dtype`` without a copy,
    on ``like``'s device."""
    shape = tuple(int(d) for d in r.shape)
    arr = r.output
    if isinstance(arr, torch.Tensor):  # device memory from _device_allocator (NCCL path)
        n = 1
        for d in shape:
            n *= d
        return arr[: n * torch.empty((), dtype=dtype).element_size()].view(dtype).reshape(shape)
    if arr is None or arr.size == 0:
        out = torch.empty(shape, dtype=dtype)
    else:
        if not arr.flags.writeable:  # torch tensors must be writable; never expected from the core
            arr = arr.copy()
        out = torch.from_numpy(arr).view(dtype).reshape(shape)
    return to_device(out, like)


class HandleTable:
    """Integer handles as Horovod has them. Every entry is one tuple, ``(core handle(s), result,
    keep, finish, device)``: the engine handle, or a group's list of them; what ``synchronize``
    returns when ``finish`` is None (the tensor(s) the operation wrote: host allreduces, most of
    a training step's handles); the tensors the core may still touch; ``finish(results)``
    building the output otherwise; the CUDA device whose current stream ``synchronize`` orders
    after the work (None: host work, waited for)."""

    def __init__(self):
        self._entries: dict = {}  # dict operations are atomic under the GIL: no lock needed
        self._ids = itertools.count(1)  # next() on it is atomic too

    def add(self, handles, result=None, keep=None, finish: Optional[Callable] = None,
            device: Optional[int] = None) -> int:
        hid = next(self._ids)
        self._entries[hid] = (handles, result, keep, finish, device)
        return hid

    def poll(self, handle: int) -> bool:
        entry = self._entries.get(handle)
        if entry is None:
            raise ValueError(f"handle {handle!r} is not an operation in flight (already synchronized?)")
        return engine.current().poll(entry[0])

    def synchronize(self, handle: int):
        """Wait for every engine operation of ``handle``; return its output. An unknown
        handle returns None, as in Horovod."""
        entry = self._entries.get(handle)
        if entry is None:
            return None
        handles, result, _, finish, device = entry
        # On CUDA, the caller's current stream waits for the device work (torch's semantics);
        # the host only waits for it to be queued. Host work is waited for.
        stream = -1 if device is None else torch.cuda.current_stream(device).cuda_stream
        try:
            r = engine.current().wait(handles, stream)
        finally:
            self._entries.pop(handle, None)
        return result if finish is None else finish(r)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
