"""Torch tensors as the engine sees them, and the table of in-flight handles.

Owns the translation between ``torch.Tensor`` and ``appliance.runtime.engine.Buffer``
(dtype codes, device, CUDA stream), the staging of tensors the core cannot use directly
(non-contiguous ones, and CUDA tensors when the core cannot use CUDA memory here: a contiguous
or host copy is used, with a one-time warning for the latter, and, for in-place operations,
copied back when the operation completes), the device allocator the core takes CUDA outputs
from (torch's caching allocator),
the conversion of core-allocated outputs into tensors without a copy, and ``HandleTable``:
Horovod-style integer handles that keep every tensor the core may touch alive until
``synchronize``. Reads no environment. Failure modes: ``ValueError`` for an unsupported
dtype or device (as Horovod); errors of the operation itself are raised by ``synchronize``.
"""
from __future__ import annotations

import itertools
import sys
import weakref
from typing import Callable, List, Optional, Sequence

import torch

from appliance.runtime import engine
from appliance.runtime.engine import Buffer, DType

_DTYPES = {
    torch.uint8: DType.UINT8, torch.int8: DType.INT8, torch.int16: DType.INT16,
    torch.int32: DType.INT32, torch.int64: DType.INT64, torch.float16: DType.FLOAT16,
    torch.bfloat16: DType.BFLOAT16, torch.float32: DType.FLOAT32, torch.float64: DType.FLOAT64,
    torch.bool: DType.BOOL,
}

SUPPORTED_DTYPES = tuple(_DTYPES)
HOST_DTYPES = {t: int(c) for t, c in _DTYPES.items()}  # torch dtype -> the core's dtype code, as an int


def dtype_code(t: torch.Tensor) -> DType:
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        names = ", ".join(str(d).replace("torch.", "") for d in _DTYPES)
        raise ValueError(f"Tensor type {t.dtype} is not supported (supported: {names})") from None


def capabilities() -> dict:
    """What executes here (``appliance.runtime.devices``; asked of the core once per process)."""
    return engine.capabilities()


_warned: set = set()
_allocator_of = None  # weak reference to the runtime that has our device allocator


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


def _give_allocator() -> None:
    global _allocator_of
    rt = engine.current()
    if _allocator_of is None or _allocator_of() is not rt:
        engine.set_device_allocator(_device_allocator)
        _allocator_of = weakref.ref(rt)


def stage(t: torch.Tensor) -> torch.Tensor:
    """The tensor the core will read/write in place of ``t`` (``t`` itself when possible).
    CUDA tensors stay on their device when the core can use CUDA memory here (it then runs
    them through NCCL, or through host staging it decides on and announces); otherwise they
    are copied to the host here, with a one-time warning saying why."""
    dtype_code(t)
    w = t.detach()
    if w.is_cpu:  # the common case first: is_cpu is far cheaper than building w.device
        return w if w.is_contiguous() else w.contiguous()
    kind = w.device.type
    if kind == "cuda":
        caps = capabilities()
        if caps.get("cuda", False):
            _give_allocator()
        else:
            _warn_once("CUDA tensors go through host memory: the collective core cannot use CUDA memory here ("
                       f"{caps.get('why') or 'no CUDA runtime'})")
            w = w.cpu()
    else:
        raise ValueError(f"tensors on device {w.device} are not supported (cpu and cuda are)")
    if not w.is_contiguous():
        w = w.contiguous()
    return w


def buffer(w: torch.Tensor) -> Buffer:
    """Describe a staged tensor (see ``stage``) to the core."""
    if w.is_cuda:
        stream = torch.cuda.current_stream(w.device).cuda_stream
        return Buffer(w.data_ptr(), dtype_code(w), tuple(w.shape), w.device.index, int(stream))
    return Buffer(w.data_ptr(), dtype_code(w), tuple(w.shape))


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


def _cuda_device(keep) -> Optional[int]:
    """The CUDA device of the first CUDA tensor among ``keep`` (nested tuples), else None."""
    for x in keep:
        if isinstance(x, torch.Tensor):
            if x.is_cuda:
                return x.device.index
        elif isinstance(x, (tuple, list)):
            d = _cuda_device(x)
            if d is not None:
                return d
    return None


class _Entry:
    __slots__ = ("handles", "keep", "finish", "device")

    def __init__(self, handles: List[int], keep: tuple, finish: Callable[[list], object]):
        self.handles, self.keep, self.finish = handles, keep, finish
        self.device = _cuda_device(keep)  # CUDA work: synchronize orders the caller's stream


def _wait_all(wait, handles) -> list:
    """``wait`` for every handle, even after one fails (no memory may be released while the core
    still uses it); then raise the first failure. Returns the results."""
    results, error = [], None
    for h in handles:
        try:
            results.append(wait(h))
        except Exception as e:  # re-raised below, once the others have finished
            results.append(None)
            error = error or e
    if error is not None:
        raise error
    return results


class HandleTable:
    """Integer handles as Horovod has them. One handle may stand for several engine
    operations (grouped ops); ``keep`` holds every tensor the core may still touch. Host
    allreduces (``add_host``) are kept as a bare ``(engine handle(s), result, input)`` tuple:
    they are most of a training step's handles, and their result is the tensor(s) they write."""

    def __init__(self):
        self._entries: dict = {}  # dict operations are atomic under the GIL: no lock needed
        self._ids = itertools.count(1)  # next() on it is atomic too

    def add(self, handles: Sequence[int], keep: tuple, finish: Callable[[list], object]) -> int:
        hid = next(self._ids)
        self._entries[hid] = _Entry(list(handles), keep, finish)
        return hid

    def add_host(self, handles, result, keep=None) -> int:
        """``add`` for host operations (``allreduce_host``) whose result is the memory they
        write: one handle and its tensor, or a group's handles and the tuple of its tensors;
        ``keep``: the input, when it is not the result."""
        hid = next(self._ids)
        self._entries[hid] = (handles, result, keep)
        return hid

    def poll(self, handle: int) -> bool:
        entry = self._entries.get(handle)
        if entry is None:
            raise ValueError(f"handle {handle!r} is not an operation in flight (already synchronized?)")
        if entry.__class__ is tuple:
            hs = entry[0]
            return engine.poll(hs) if hs.__class__ is int else all(engine.poll(h) for h in hs)
        return all(engine.poll(h) for h in entry.handles)

    def synchronize(self, handle: int):
        """Wait for every engine operation of ``handle``; return its output. An unknown
        handle returns None, as in Horovod."""
        entry = self._entries.get(handle)
        if entry is None:
            return None
        if entry.__class__ is tuple:
            hs, result = entry[0], entry[1]
            try:
                if hs.__class__ is int:
                    engine.current().wait_host(hs)
                else:
                    engine.current().wait_host_all(hs)
            finally:
                self._entries.pop(handle, None)
            return result
        # On CUDA, the caller's current stream waits for the device work (torch's semantics);
        # the host only waits for it to be queued. Host work is waited for.
        stream = None if entry.device is None else torch.cuda.current_stream(entry.device).cuda_stream
        try:
            results = _wait_all(lambda h: engine.wait(h, stream), entry.handles)
        finally:
            self._entries.pop(handle, None)
        return entry.finish(results)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
