"""Adasum (collectives/adasum.cc) against a numpy reference of the recursive pairwise Adasum,
on 2 and 4 ranks (power of 2: vector-halving distance-doubling) and 3 and 5 ranks (the extra
ranks are folded into partners first), run as threads over socketpairs
(``_core_testing.run_collective("adasum", ...)``; ``counts`` = tensors of a fused buffer).
"""
from __future__ import annotations

import numpy as np
import pytest

from _dataplane_helpers import DTYPES, T, bf16_to_f32, code, outputs_as, run

pytestmark = pytest.mark.timeout(120)


def adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1.0 - dot / (2 * aa) if aa > 0 else 1.0
    cb = 1.0 - dot / (2 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def adasum_ref(xs: list, counts=None) -> np.ndarray:
    """Recursive Adasum in float64: ranks >= Q (largest power of 2 <= P) folded into rank
    r - Q, then a binary tree over ranks 0..Q-1 ((0,1), (2,3), then their results...);
    each tensor of ``counts`` on its own."""
    xs = [np.asarray(x, np.float64) for x in xs]
    n = xs[0].size
    counts = [n] if counts is None else list(counts)
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)

    def pair(a, b):
        out = np.empty_like(a)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            out[lo:hi] = adasum_pair(a[lo:hi], b[lo:hi])
        return out

    P = len(xs)
    Q = 1 << (P.bit_length() - 1)
    vs = [xs[r] if r + Q >= P else pair(xs[r], xs[r + Q]) for r in range(Q)]
    while len(vs) > 1:
        vs = [pair(vs[i], vs[i + 1]) for i in range(0, len(vs), 2)]
    return vs[0]


def adasum(P, xs, name="float64", **kw) -> list:
    return outputs_as(run("adasum", P, xs, dtype=code(name), **kw), name)


@pytest.mark.parametrize("P", (2, 4))
@pytest.mark.parametrize("name,tol", (("float64", 1e-12), ("float32", 2e-5)))
def test_adasum_matches_recursive_reference_power_of_two(P, name, tol):
    rng = np.random.default_rng(P)
    for n in (1, 2, 7, 301, 2503):
        xs = [rng.standard_normal(n).astype(DTYPES[name]) for _ in range(P)]
        outs = adasum(P, xs, name, max_frame=256, chunk_bytes=44)  # dots taken per piece
        want = adasum_ref(xs)
        for r, o in enumerate(outs):
            np.testing.assert_allclose(o, want, rtol=tol, atol=tol, err_msg=f"{name} n={n} rank {r}")
            assert o.tobytes() == outs[0].tobytes(), "ranks disagree"


@pytest.mark.parametrize("P", (3, 5))
def test_adasum_non_power_of_two_folds_extra_ranks_into_partners(P):
    rng = np.random.default_rng(30 + P)
    for n in (1, 5, 1001):
        xs = [rng.standard_normal(n) for _ in range(P)]
        want = adasum_ref(xs)
        for chunk in (40, 1 << 20):  # the fold's dot products piece by piece, or in one piece
            outs = adasum(P, xs, chunk_bytes=chunk)
            for r, o in enumerate(outs):
                np.testing.assert_allclose(o, want, rtol=1e-12, atol=1e-12, err_msg=f"P={P} n={n} rank {r}")


@pytest.mark.parametrize("P", (2, 3, 4))
def test_fused_tensors_each_get_their_own_dot_products(P):
    rng = np.random.default_rng(40 + P)
    counts = [3, 0, 250, 1, 48]
    xs = [rng.standard_normal(sum(counts)) for _ in range(P)]
    outs = adasum(P, xs, counts=counts, chunk_bytes=24)  # pieces cut across tensors
    want = adasum_ref(xs, counts)
    assert not np.allclose(want, adasum_ref(xs)), "per-tensor and whole-buffer Adasum should differ here"
    bounds = np.cumsum([0] + counts)
    for r, o in enumerate(outs):
        np.testing.assert_allclose(o, want, rtol=1e-12, atol=1e-12, err_msg=f"rank {r}")
        for lo, hi in zip(bounds[:-1], bounds[1:]):  # same as reducing each tensor alone
            if hi > lo:
                alone = adasum(P, [x[lo:hi] for x in xs])[r]
                np.testing.assert_allclose(o[lo:hi], alone, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("P", (2, 3, 4))
def test_orthogonal_inputs_add_up_and_equal_inputs_give_the_input(P):
    n = 4 * P + 3
    ortho = [np.zeros(n) for _ in range(P)]
    for r in range(P):
        ortho[r][r * 4:(r + 1) * 4] = r + 1.5
    np.testing.assert_allclose(adasum(P, ortho)[0], np.sum(ortho, 0), rtol=1e-12)
    v = np.linspace(-2, 3, n)
    for o in adasum(P, [v.copy() for _ in range(P)]):
        np.testing.assert_allclose(o, v, rtol=1e-12, atol=1e-12)
    # zero-norm safe: a rank with a zero gradient (or all of them) gives finite results
    rng = np.random.default_rng(P)
    xs = [rng.standard_normal(n) for _ in range(P)]
    xs[P - 1][:] = 0
    outs = adasum(P, xs)
    assert np.all(np.isfinite(outs[0]))
    np.testing.assert_allclose(outs[0], adasum_ref(xs), rtol=1e-12, atol=1e-12)
    zeros = adasum(P, [np.zeros(n) for _ in range(P)])
    assert all(np.array_equal(o, np.zeros(n)) for o in zeros)


@pytest.mark.parametrize("P", (2, 3, 4))
def test_16_bit_floats_accumulate_in_float(P):
    rng = np.random.default_rng(50 + P)
    n = 513
    vals = [rng.standard_normal(n).astype(np.float32) for _ in range(P)]
    half = [v.astype(np.float16) for v in vals]
    out = adasum(P, half, "float16")[0].astype(np.float64)
    np.testing.assert_allclose(out, adasum_ref([h.astype(np.float64) for h in half]), rtol=5e-3, atol=5e-3)
    bf = [(v.view(np.uint32) >> 16).astype(np.uint16) for v in vals]  # truncated to bfloat16
    outb = bf16_to_f32(adasum(P, bf, "bfloat16")[0]).astype(np.float64)
    np.testing.assert_allclose(outb, adasum_ref([bf16_to_f32(b) for b in bf]), rtol=3e-2, atol=3e-2)


def test_adasum_of_nothing_one_rank_and_integers():
    assert all(o.size == 0 for o in adasum(3, [np.zeros(0)] * 3))
    x = np.arange(5, dtype=np.float64)
    assert np.array_equal(adasum(1, [x])[0], x)
    res = T.run_collective("adasum", 2, [np.arange(4, dtype=np.int32).tobytes()] * 2, dtype=code("int32"))
    for e in res["errors"]:
        assert e is not None and e["code"] == T.CODES["invalid argument"], e


def test_repeated_adasum_on_one_comm_with_small_frames_keeps_streams_in_step():
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(777) for _ in range(4)]
    for o in adasum(4, xs, iterations=3, max_frame=64):
        np.testing.assert_allclose(o, adasum_ref(xs), rtol=1e-12, atol=1e-12)


def test_cuda_adasum_entries_go_through_host_staging_with_a_reason():
    from appliance.runtime.engine import Adasum, DType, Kind
    for dt in (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64):
        path, why = T.select_cuda_backend(Kind.ALLREDUCE, dt, Adasum, 1.0, 1.0)
        assert path == "staging" and "Adasum" in why
