"""Where the collective core finds the CUDA runtime and NCCL, and what really executes here.

The core loads both with dlopen() (one build for CPU and GPU hosts; nothing CUDA at build
time). This module decides where to look, in this order, without importing torch:

1. NCCL: ``APPLIANCE_NCCL_LIBRARY`` when set (alone: a knob that fails is reported, never
   silently replaced), else the ``nvidia-nccl-*`` wheel next to torch
   (``site-packages/nvidia/nccl/lib/libnccl.so.2``), else the system loader path
   (``libnccl.so.2``).
2. CUDA runtime: the ``nvidia-cuda-runtime`` wheels next to torch (CUDA 13, then 12), else the
   loader path.

``capabilities()`` asks the core once per process and says what executes, never what merely
loads: ``cuda`` (the core can use CUDA memory: a runtime loaded and a device is visible),
``nccl`` (NCCL can run collectives here: CUDA usable and a recent enough NCCL loaded),
``nccl_version`` (the version of the NCCL that loaded, even where it cannot run, e.g. in the GPU
image on a host without a GPU; 0 when none did), ``nccl_library``, ``cuda_devices``,
``cuda_runtime`` and ``why`` (one line: what is missing, "" when everything runs).
Env: APPLIANCE_NCCL_LIBRARY (through ``appliance.common.knobs``). Failure modes: none raised;
a library that cannot be used is described in ``why``.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import List, Optional

from appliance.common.knobs import read

NCCL_SONAME = "libnccl.so.2"
_CUDART_WHEELS = ("nvidia/cu13/lib/libcudart.so.13", "nvidia/cuda_runtime/lib/libcudart.so.13",
                  "nvidia/cuda_runtime/lib/libcudart.so.12")
_CUDART_SONAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")

_caps: Optional[dict] = None


def _wheel_roots() -> List[Path]:
    """site-packages directories to look in: torch's first (where its CUDA wheels live)."""
    roots: List[Path] = []
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        roots.append(Path(spec.origin).resolve().parent.parent)
    spec = importlib.util.find_spec("nvidia")
    if spec is not None:
        for loc in spec.submodule_search_locations or []:
            root = Path(loc).resolve().parent
            if root not in roots:
                roots.append(root)
    return roots


def nccl_library_knob(env=None) -> str:
    return read("APPLIANCE_NCCL_LIBRARY", os.environ if env is None else env)


def nccl_candidates() -> List[str]:
    found = [str(r / "nvidia/nccl/lib" / NCCL_SONAME) for r in _wheel_roots()]
    return [p for p in found if os.path.exists(p)] + [NCCL_SONAME]


def cudart_candidates() -> List[str]:
    found = [str(r / rel) for r in _wheel_roots() for rel in _CUDART_WHEELS]
    return [p for p in found if os.path.exists(p)] + list(_CUDART_SONAMES)


def capabilities(refresh: bool = False) -> dict:
    """What executes here (see the module text); asked of the core once per process."""
    global _caps
    if _caps is None or refresh:
        from appliance.runtime import _core
        _caps = dict(_core.capabilities(nccl_library_knob(), nccl_candidates(), cudart_candidates()))
    return dict(_caps)
