"""Shared pieces of the torch test workers: reproducible inputs and Horovod's reference maths."""
from __future__ import annotations

import zlib

import torch

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.bool]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
LARGE = 100_003  # odd, and many pipeline chunks at APPLIANCE_CHUNK_BYTES=8K
SIZES = [0, 1, 17, LARGE]


def data(case: str, r: int, shape, dtype) -> torch.Tensor:
    """Rank ``r``'s input for ``case``: small integers, so sums, products, min and max are exact
    in every dtype (3 ranks: |product| <= 27 fits int8)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{case}/{r}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=g).bool()
    lo, hi = (0, 5) if dtype == torch.uint8 else (-3, 4)
    return torch.randint(lo, hi, tuple(shape), generator=g).to(dtype)


def _scale(x: torch.Tensor, f: float) -> torch.Tensor:
    """The core's scaling: in double, integers truncated toward zero."""
    if f == 1.0:
        return x
    y = x.double() * f
    return y if x.dtype.is_floating_point else y.trunc().to(torch.int64)


def ref_reduce(xs, op, hvd, pre=1.0, post=1.0) -> torch.Tensor:
    dt = xs[0].dtype
    if dt == torch.bool:
        st = torch.stack(xs)
        return st.any(0) if op in (hvd.Sum, hvd.Max) else st.all(0)
    wide = torch.float64 if dt.is_floating_point else torch.int64
    st = torch.stack([_scale(x.to(wide), pre) for x in xs])
    if op in (hvd.Sum, hvd.Average):
        r = st.sum(0)
    elif op == hvd.Min:
        r = st.amin(0)
    elif op == hvd.Max:
        r = st.amax(0)
    else:
        r = st.prod(0)
    r = _scale(r, post * (1.0 / len(xs)) if op == hvd.Average else post)
    return r.to(dt)


def tol(dt):
    return {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-5}.get(dt, 1e-12)


def check(got, want, what: str, exact: bool = True) -> None:
    assert isinstance(got, torch.Tensor), f"{what}: got {type(got)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, want {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
    if exact:
        ok = torch.equal(got, want)
    else:
        t = tol(want.dtype)
        ok = torch.allclose(got.double(), want.double(), rtol=t, atol=t)
    if not ok:
        diff = (got.double() - want.double()).abs().reshape(-1) if got.numel() else torch.zeros(1)
        i = int(diff.argmax())
        raise AssertionError(f"{what}: values differ (largest at flat index {i}: got "
                             f"{got.reshape(-1)[i].item()}, want {want.reshape(-1)[i].item()})")


def block(dim0: int, r: int, n: int):
    """Horovod's reducescatter block of rank r: (start, rows)."""
    q, m = divmod(dim0, n)
    return r * q + min(r, m), q + (1 if r < m else 0)


def expect_raises(exc, fn, what: str):
    try:
        fn()
    except exc as e:
        return e
    raise AssertionError(f"{what}: expected {exc.__name__}")
