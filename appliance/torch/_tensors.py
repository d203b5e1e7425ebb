"""Torch tensors as the engine sees them, the device policy, and the table of in-flight handles.

Owns the translation between ``torch.Tensor`` and the core's tensor descriptors
(``appliance.runtime.engine.TensorDesc``: dtype, device, CUDA stream), the one test of the short
path (``host_desc``: a tensor the core can use as it is), the staging of tensors the core
cannot use directly (non-contiguous ones, and CUDA tensors when the core cannot use CUDA memory
here: a contiguous or host copy is used, with a one-time warning for the latter, and, for
in-place operations, copied back when the operation completes), the device policy, decided once
per process and not per op (``setup`` at ``hvd.init`` gives the core torch's caching allocator for
the CUDA outputs it sizes; whether the core can use CUDA memory is asked at the first CUDA
tensor), the conversion of core-allocated outputs into tensors without a copy, and
``HandleTable``: Horovod-style integer handles that keep every tensor the core may touch alive
until ``synchronize``. Reads no environment. Failure modes: ``ValueError`` for an unsupported
dtype or device (as Horovod); errors of the operation itself are raised by ``synchronize``.
"""
from __future__ import annotations

import itertools
import sys
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


def host_desc(t: torch.Tensor, inplace: bool):
    """The short path's one gate, for every allreduce (single or grouped, in place or not):
    ``(desc, out)`` when the core can read and write ``t``'s memory as it is (a contiguous host
    tensor of a supported dtype), ``desc`` being the tuple ``engine.submit`` takes and ``out`` the
    tensor that receives the result (``t`` itself in place, else a new one); None when ``t`` must
    be staged (``stage``)."""
    if not (t.is_cpu and t.is_contiguous()):
        return None
    dt = HOST_DTYPES.get(t.dtype)
    if dt is None:
        return None
    ptr = t.data_ptr()
    if inplace:
        return (ptr, dt, t.shape, ptr), t
    out = torch.empty(t.shape, dtype=t.dtype)
    return (ptr, dt, t.shape, out.data_ptr()), out


# --- device policy (decided once per process) ---------------------------------------------
_cuda_usable: Optional[bool] = None  # the core can use CUDA memory here; None: no CUDA tensor seen yet
_cuda_why = ""
_warned: set = set()


def capabilities() -> dict:
    """What executes here (``appliance.runtime.devices``; asked of the core once per process)."""
    return engine.capabilities()


def setup() -> None:
    """``hvd.init``'s part of the device policy: the core takes the CUDA outputs it sizes (NCCL
    path) from torch's caching allocator, in this and every later runtime of the process. Touches
    no device: whether the core can use CUDA memory is asked once, at the first CUDA tensor
    (``_decide_cuda``), so a CPU job never initializes CUDA (slow on a GPU host, and a process
    that has cannot fork children that use it)."""
    engine.use_device_allocator(_device_allocator)


def _decide_cuda() -> None:
    global _cuda_usable, _cuda_why
    setup()  # in case the runtime was started without hvd.init (appliance.runtime.init)
    caps = capabilities()
    _cuda_why = caps.get("why") or "no CUDA runtime"
    _cuda_usable = bool(caps.get("cuda", False))


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
    if _cuda_usable is None:  # the first CUDA tensor of the process
        _decide_cuda()
    if not _cuda_usable:
        _warn_once(f"CUDA tensors go through host memory: the collective core cannot use CUDA memory here ({_cuda_why})")
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
        entry = self._entries.pop(handle, None)  # forgotten even when the wait raises
        if entry is None:
            return None
        handles, result, _, finish, device = entry  # ``entry`` keeps the tensors alive while waiting
        if device is None:  # host work is waited for
            r = engine.current().wait(handles, -1)
        else:  # the caller's current stream waits for the device work (torch's semantics); the
            # host only waits for it to be queued
            r = engine.current().wait(handles, torch.cuda.current_stream(device).cuda_stream)
        return result if finish is None else finish(r)

    def synchronize_all(self, handles) -> list:
        """``[synchronize(h) for h in handles]``, with every host operation among them waited for
        in one core call (``engine.wait`` of a list: each is waited for even after one failed,
        and the first failure is raised once all are done). Entries with CUDA work, and unknown
        handles, go one by one as ``synchronize`` takes them."""
        entries = [self._entries.get(h) for h in handles]
        if len(entries) < 2 or any(e is None or e[4] is not None for e in entries):
            return [self.synchronize(h) for h in handles]
        core, spans = [], []
        for e in entries:
            hs = e[0]
            start = len(core)
            if hs.__class__ is int:
                core.append(hs)
                spans.append(start)
            else:
                core.extend(hs)
                spans.append((start, len(core)))
        try:
            rs = engine.current().wait(core, -1) if core else None
        finally:
            for h in handles:
                self._entries.pop(h, None)
        out = []
        for (_, result, _, finish, _), span in zip(entries, spans):
            if finish is None:
                out.append(result)
            elif span.__class__ is int:
                out.append(finish(None if rs is None else rs[span]))
            else:
                out.append(finish([None] * (span[1] - span[0]) if rs is None else rs[span[0]:span[1]]))
        return out

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
