"""Reduction and scaling kernels (collectives/reduce.cc) against numpy, and the float16 /
bfloat16 conversions against numpy and torch (independent implementations): exhaustive over
all 65536 16-bit patterns one way, millions of random float32 patterns plus edge cases the
other way. The kernel tests run twice: on the portable loops, and on the CPU-specific 16-bit
float kernels (reduce_x86.cc: AVX2 + F16C), which must also match the portable loops bit for
bit over every pair of 16-bit patterns in a full permutation.
"""
from __future__ import annotations

import numpy as np
import pytest

from _dataplane_helpers import DTYPES, FLOATS, OPS, T, bf16_to_f32, code, op_code

torch = pytest.importorskip("torch")

N = 4099  # odd: exercises the vector loops' remainders


@pytest.fixture(params=["portable", "cpu"])
def kernels(request):
    """Which 16-bit float kernels run: the portable loops, or this CPU's (x86-64 AVX2+F16C)."""
    if request.param == "cpu" and not T.kernels_available():
        pytest.skip("this CPU has no AVX2+F16C: only the portable kernels exist here")
    T.use_portable_kernels(request.param == "portable")
    yield request.param
    T.use_portable_kernels(False)


def bf16_from_f32(x: np.ndarray) -> np.ndarray:
    """Reference float32 -> bfloat16 bits through torch (round to nearest even)."""
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def random_input(name, rng, with_nan=False):
    st = DTYPES[name]
    if name == "bool":
        return rng.integers(0, 4, N).astype(np.uint8) * rng.integers(0, 2, N).astype(np.uint8) * 63
    if name in FLOATS:
        v = (rng.standard_normal(N) * 4).astype(np.float32)
        if with_nan:
            v[rng.integers(0, N, 20)] = np.nan
            v[rng.integers(0, N, 5)] = np.inf
        return bf16_from_f32(v) if name == "bfloat16" else v.astype(st)
    info = np.iinfo(st)
    return rng.integers(info.min, info.max, N, dtype=st, endpoint=True)


def reference(a, b, name, op):
    if name == "bool":
        x, y = a != 0, b != 0
        return (x | y if op in ("Sum", "Max") else x & y).astype(np.uint8)
    if name == "bfloat16":
        fa, fb = bf16_to_f32(a), bf16_to_f32(b)
        r = {"Sum": fa + fb, "Min": np.minimum(fa, fb), "Max": np.maximum(fa, fb), "Product": fa * fb}[op]
        return bf16_from_f32(r)
    fn = {"Sum": np.add, "Min": np.minimum, "Max": np.maximum, "Product": np.multiply}[op]
    with np.errstate(all="ignore"):
        return fn(a, b, dtype=DTYPES[name])


def same(x, y, name):
    if name == "bfloat16":
        fx, fy = bf16_to_f32(x), bf16_to_f32(y)
        return np.array_equal(np.isnan(fx), np.isnan(fy)) and np.array_equal(x[~np.isnan(fx)], y[~np.isnan(fy)])
    if name in FLOATS:
        return np.array_equal(x, y, equal_nan=True)
    return np.array_equal(x, y)


def test_reduce_into_every_dtype_and_op(kernels):
    rng = np.random.default_rng(1)
    for name in DTYPES:
        for op in OPS:
            for with_nan in ((False, True) if name in FLOATS else (False,)):
                a, b = random_input(name, rng, with_nan), random_input(name, rng, with_nan)
                want = reference(a, b, name, op)
                dst = a.copy()
                T.reduce_into(dst, b, code(name), op_code(op))
                assert same(dst, want, name), f"{name} {op} nan={with_nan}: {dst[:6]} vs {want[:6]}"


def test_reduce_into_rejects_average_and_adasum():
    a = np.zeros(4, np.float32)
    for bad in ("Average", "Adasum"):
        with pytest.raises(T.CoreError) as ei:
            T.reduce_into(a, a.copy(), code("float32"), op_code(bad))
        assert ei.value.code == T.CODES["invalid argument"]


def test_integer_sum_and_product_wrap():
    a = np.array([127, -128, 100], np.int8)
    T.reduce_into(a, np.array([1, -1, 100], np.int8), code("int8"), op_code("Sum"))
    assert a.tolist() == [-128, 127, -56]
    b = np.array([65535, 300], np.uint16).view(np.int16)
    T.reduce_into(b, np.array([65535, 300], np.uint16).view(np.int16), code("int16"), op_code("Product"))
    assert b.view(np.uint16).tolist() == [1, (300 * 300) % 65536]


def scale_reference(x, name, f):
    if f == 1.0:  # documented no-op (int64 would otherwise lose bits through double)
        return x
    if name in ("float32", "float64"):
        return (x * DTYPES[name](f)).astype(DTYPES[name])
    if name == "float16":
        return (x.astype(np.float32) * np.float32(f)).astype(np.float16)
    if name == "bfloat16":
        return bf16_from_f32(bf16_to_f32(x) * np.float32(f))
    if name == "bool":
        return x if f != 0 else np.zeros_like(x)
    with np.errstate(all="ignore"):
        return np.trunc(x.astype(np.float64) * f).astype(np.int64).astype(DTYPES[name])


def test_scale_every_dtype(kernels):
    rng = np.random.default_rng(2)
    for name in DTYPES:
        for f in (1.0, 0.5, 1 / 3, -2.5, 0.0, 1e-3):
            x = random_input(name, rng)
            if name in ("int64",):  # keep x * f inside int64 so the reference is defined
                x = x // 8
            want = scale_reference(x, name, f)
            got = x.copy()
            T.scale(got, code(name), f)
            assert same(got, want, name), f"{name} x{f}: {got[:6]} vs {want[:6]} (from {x[:6]})"


def test_integer_scale_truncates_toward_zero():
    x = np.array([7, -7, 5, -5, 1, -1], np.int32)
    T.scale(x, code("int32"), 0.5)
    assert x.tolist() == [3, -3, 2, -2, 0, 0]  # Horovod's integer Average


def test_half_to_float_exhaustive():
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = np.empty(65536, np.float32)
    T.widen16(bits, got, False)
    want = bits.view(np.float16).astype(np.float32)
    assert np.array_equal(got, want, equal_nan=True)
    nan = np.isnan(want)  # payloads are kept too
    assert np.array_equal(got.view(np.uint32)[nan] & 0x7FFFFFFF, want.view(np.uint32)[nan] & 0x7FFFFFFF)


def test_bfloat16_to_float_exhaustive():
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = np.empty(65536, np.float32)
    T.widen16(bits, got, True)
    want = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float().numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


EDGES = np.array([0.0, -0.0, 1.0, 65504.0, 65519.996, 65520.0, 65536.0, 1e10, np.inf, -np.inf,
                  2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -25, 3 * 2.0 ** -25, 2.0 ** -26,
                  2.0 ** -14 - 2.0 ** -25, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1e-45, 3.4e38,
                  1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 255.5, 256.5], np.float32)


def float_inputs():
    rng = np.random.default_rng(3)
    rand_bits = rng.integers(0, 2 ** 32, 2_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    near = (rng.standard_normal(500_000) * 1000).astype(np.float32)
    return np.concatenate([EDGES, -EDGES, rand_bits, near])


def check_narrow(x, got, want_bits, as_f32):
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want_bits[~nan]), "rounding differs"
    back = as_f32(got[nan])
    assert np.all(np.isnan(back)), "NaN must stay NaN"
    assert np.array_equal(np.signbit(back), np.signbit(x[nan])), "NaN sign"


def test_float_to_half_round_to_nearest_even():
    x = float_inputs()
    got = np.empty(x.size, np.uint16)
    T.narrow16(x, got, False)
    with np.errstate(all="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    check_narrow(x, got, want, lambda b: b.view(np.float16).astype(np.float32))


def test_float_to_bfloat16_round_to_nearest_even():
    x = float_inputs()
    got = np.empty(x.size, np.uint16)
    T.narrow16(x, got, True)
    check_narrow(x, got, bf16_from_f32(x), bf16_to_f32)


def is_nan16(bits: np.ndarray, name: str) -> np.ndarray:
    exp, mant = (0x7c00, 0x3ff) if name == "float16" else (0x7f80, 0x7f)
    return ((bits & exp) == exp) & ((bits & mant) != 0)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_cpu_kernels_match_portable_bit_for_bit_over_all_patterns(name):
    if not T.kernels_available():
        pytest.skip("this CPU has no AVX2+F16C: only the portable kernels exist here")
    rng = np.random.default_rng(5)
    a = np.arange(65536, dtype=np.uint32).astype(np.uint16)  # every pattern: NaNs, infinities, subnormals
    b = rng.permutation(a)
    try:
        for op in OPS:
            got = {}
            for portable in (True, False):
                T.use_portable_kernels(portable)
                dst = a.copy()
                T.reduce_into(dst, b, code(name), op_code(op))
                got[portable] = dst
            # Where both operands are NaN, IEEE leaves open which payload the result carries
            # (and compilers order commutative operands freely): both results must be NaN there.
            both_nan = is_nan16(a, name) & is_nan16(b, name)
            assert is_nan16(got[True][both_nan], name).all() and is_nan16(got[False][both_nan], name).all()
            diff = np.flatnonzero((got[True] != got[False]) & ~both_nan)
            assert diff.size == 0, f"{name} {op}: {diff.size} differ, first {a[diff[:3]]} op {b[diff[:3]]}"
        for f in (0.5, 1 / 3, -2.5, 1e-3, 3e4):
            got = {}
            for portable in (True, False):
                T.use_portable_kernels(portable)
                x = a.copy()
                T.scale(x, code(name), f)
                got[portable] = x
            assert np.array_equal(got[True], got[False]), f"{name} x{f}"
    finally:
        T.use_portable_kernels(False)
