"""Shared helpers for the data-plane tests (tests/runtime/test_dataplane_*.py).

Wraps the ``_core_testing`` hooks with numpy: dtype tables (bfloat16 travels as its uint16
bit pattern, since numpy has no bfloat16), random inputs per dtype, numpy reference
reductions, and ``run`` which executes one collective on N threads over socketpairs (or
shared-memory links, ``TRANSPORT``) and fails the test with every rank's error if any rank
failed.
"""
from __future__ import annotations

import numpy as np

from appliance.runtime import _core_testing as T

# name -> (dtype code, numpy storage dtype)
DTYPES = {
    "uint8": np.uint8,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "float16": np.float16,
    "bfloat16": np.uint16,
    "float32": np.float32,
    "float64": np.float64,
    "bool": np.uint8,
}
FLOATS = ("float16", "bfloat16", "float32", "float64")
OPS = ("Sum", "Min", "Max", "Product")


def code(name: str) -> int:
    return T.DTYPES[name]


def op_code(name: str) -> int:
    return T.OPS[name]


def esize(name: str) -> int:
    return np.dtype(DTYPES[name]).itemsize


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_exact(x: np.ndarray) -> np.ndarray:
    """float32 values that bfloat16 represents exactly -> their bit patterns (asserted)."""
    u = np.asarray(x, np.float32).view(np.uint32)
    assert not np.any(u & 0xFFFF), "value not exactly representable in bfloat16"
    return (u >> 16).astype(np.uint16)


def as_values(arr: np.ndarray, name: str) -> np.ndarray:
    """Storage array -> numeric values (float64 for floats, the int type for ints)."""
    if name == "bfloat16":
        return bf16_to_f32(arr).astype(np.float64)
    if name in FLOATS:
        return arr.astype(np.float64)
    return arr


def gen(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Random input. Floats are small integers so every reduction order gives exact results."""
    st = DTYPES[name]
    if name == "bool":
        return rng.integers(0, 2, n).astype(np.uint8)
    if name in FLOATS:
        v = rng.integers(-3, 4, n).astype(np.float32)
        return f32_to_bf16_exact(v) if name == "bfloat16" else v.astype(st)
    info = np.iinfo(st)
    return rng.integers(info.min, info.max, n, dtype=st, endpoint=True)


def reduce_ref(arrays: list[np.ndarray], name: str, op: str) -> np.ndarray:
    """numpy reference of an element-wise reduction over ranks (integer ops wrap)."""
    if name == "bool":
        b = np.stack(arrays).astype(bool)
        r = b.any(axis=0) if op in ("Sum", "Max") else b.all(axis=0)
        return r.astype(np.uint8)
    st = DTYPES[name]
    if name in FLOATS:
        v = np.stack([as_values(a, name) for a in arrays])
        r = {"Sum": v.sum(0), "Min": v.min(0), "Max": v.max(0), "Product": v.prod(0)}[op]
        r = r.astype(np.float32)
        return f32_to_bf16_exact(r) if name == "bfloat16" else r.astype(st)
    s = np.stack(arrays)
    fn = {"Sum": np.add, "Min": np.minimum, "Max": np.maximum, "Product": np.multiply}[op]
    return fn.reduce(s, axis=0, dtype=st)


# The links ``run`` uses unless a test names one: "tcp" (socketpairs) or "shm" (shared-memory
# rings with a socketpair doorbell). Test modules parametrize it through the ``transport``
# fixture so every collective runs over both.
TRANSPORT = {"name": "tcp"}


def run(kind: str, nranks: int, inputs: list, **kw) -> list[bytes]:
    """Run a collective; assert every rank succeeded; return per-rank output bytes."""
    kw.setdefault("transport", TRANSPORT["name"])
    res = T.run_collective(kind, nranks, [bytes(memoryview(np.ascontiguousarray(x)).cast("B"))
                                          if isinstance(x, np.ndarray) else bytes(x) for x in inputs], **kw)
    errs = [e for e in res["errors"] if e is not None]
    assert not errs, f"{kind} P={nranks} {kw}: rank errors {res['errors']}"
    return res["outputs"]


def outputs_as(outs: list[bytes], name: str) -> list[np.ndarray]:
    return [np.frombuffer(o, DTYPES[name]) for o in outs]
