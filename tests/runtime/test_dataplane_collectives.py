"""Every collective of the data plane against numpy, on 2, 3 and 5 ranks run as threads over
socketpairs and again over shared-memory links (``_core_testing.run_collective``). Sizes 0, 1, odd and multi-chunk; small
``chunk_bytes``/``max_frame`` push messages through the multi-frame and multi-piece paths,
and one large case crosses the channel's small-frame threshold.
"""
from __future__ import annotations

import numpy as np
import pytest

from _dataplane_helpers import (DTYPES, FLOATS, OPS, TRANSPORT, T, as_values, code, esize, gen, op_code,
                                outputs_as, reduce_ref, run)


@pytest.fixture(autouse=True, params=["tcp", "shm"])
def transport(request):
    TRANSPORT["name"] = request.param
    yield request.param
    TRANSPORT["name"] = "tcp"

RANKS = (2, 3, 5)
# (elements, chunk_bytes, max_frame)
SHAPES = [(0, 64, 64), (1, 64, 64), (7, 16, 24), (301, 40, 24), (2503, 3000, 8192)]


@pytest.mark.parametrize("algo", [1, 2], ids=["ring", "doubling"])
@pytest.mark.parametrize("P", RANKS)
def test_allreduce_every_dtype_op_size(P, algo):
    rng = np.random.default_rng(P)
    for name in DTYPES:
        for i, op in enumerate(OPS):
            for j, (n, chunk, frame) in enumerate(SHAPES):
                # in place, or into a separate output (the harness fails a rank whose input changed)
                alias = (i + j) % 2 == 1
                xs = [gen(name, n, rng) for _ in range(P)]
                outs = outputs_as(run("allreduce", P, xs, dtype=code(name), op=op_code(op), alias=alias,
                                      chunk_bytes=chunk, max_frame=frame, allreduce_algo=algo), name)
                want = reduce_ref(xs, name, op)
                for r, o in enumerate(outs):
                    assert np.array_equal(o, want), f"{name} {op} n={n} alias {alias} rank {r}: {o[:8]} != {want[:8]}"


@pytest.mark.parametrize("algo", [0, 1, 2], ids=["auto", "ring", "doubling"])
@pytest.mark.parametrize("P", RANKS + (4, 8))
def test_allreduce_random_floats_close_and_identical_on_all_ranks(P, algo):
    rng = np.random.default_rng(10 + P)
    for i, (name, tol) in enumerate((("float32", 1e-5), ("float64", 1e-12), ("float16", 2e-2))):
        xs = [rng.standard_normal(1001).astype(DTYPES[name]) for _ in range(P)]
        outs = outputs_as(run("allreduce", P, xs, dtype=code(name), op=op_code("Sum"), alias=i == 1,
                              chunk_bytes=96, max_frame=200, allreduce_algo=algo), name)
        np.testing.assert_allclose(outs[0], np.sum(np.stack(xs).astype(np.float64), 0), rtol=tol, atol=tol)
        for o in outs[1:]:  # ring: reduced on one rank, then copied; doubling: x+y and y+x: same bits
            assert o.tobytes() == outs[0].tobytes()


def test_allreduce_single_rank_and_bad_op():
    x = np.arange(5, dtype=np.float32)
    assert np.array_equal(outputs_as(run("allreduce", 1, [x]), "float32")[0], x)
    for bad in ("Average", "Adasum"):
        res = T.run_collective("allreduce", 3, [x.tobytes()] * 3, dtype=code("float32"), op=op_code(bad))
        for e in res["errors"]:
            assert e is not None and e["code"] == T.CODES["invalid argument"], e
            assert bad in e["message"]


def test_allreduce_repeated_on_one_comm_keeps_streams_in_step():
    # Three back-to-back allreduces over the same links: frame sequence numbers carry over.
    xs = [np.full(33, r + 1, np.int32) for r in range(3)]
    outs = outputs_as(run("allreduce", 3, xs, dtype=code("int32"), op=op_code("Sum"),
                          chunk_bytes=8, max_frame=12, iterations=3), "int32")
    for o in outs:
        assert np.array_equal(o, np.full(33, 6, np.int32))


@pytest.mark.parametrize("P", RANKS)
def test_allgatherv_uneven_sizes_including_zero(P):
    rng = np.random.default_rng(20 + P)
    layouts = [[0] * P, [1] * P, [r * 3 % 5 for r in range(P)], [0] + [37] * (P - 1),
               [int(s) for s in rng.integers(0, 900, P)]]
    for sizes in layouts:
        for alias in (False, True):
            xs = [rng.integers(0, 256, s, dtype=np.uint8) for s in sizes]
            outs = run("allgatherv", P, xs, alias=alias, chunk_bytes=64, max_frame=50)
            want = np.concatenate(xs).tobytes()
            for r, o in enumerate(outs):
                assert o == want, f"sizes {sizes} alias {alias} rank {r}"


@pytest.mark.parametrize("P", RANKS)
def test_broadcast_every_root_both_algorithms(P):
    rng = np.random.default_rng(30 + P)
    for nbytes in (0, 1, 13, 1000, 9000):
        for root in range(P):
            for algo in (0, 1, 2):  # auto, tree, chain
                xs = [rng.integers(0, 256, nbytes, dtype=np.uint8) for _ in range(P)]
                outs = run("broadcast", P, xs, root=root, broadcast_algo=algo, chunk_bytes=300, max_frame=128)
                for r, o in enumerate(outs):
                    assert o == xs[root].tobytes(), f"n={nbytes} root={root} algo={algo} rank {r}"


def test_broadcast_bad_root_is_invalid():
    res = T.run_collective("broadcast", 2, [b"ab", b"cd"], root=2)
    assert all(e is not None and e["code"] == T.CODES["invalid argument"] for e in res["errors"])


@pytest.mark.parametrize("P", RANKS)
def test_alltoallv_uneven_including_zero(P):
    rng = np.random.default_rng(40 + P)
    matrices = [np.zeros((P, P), int), np.ones((P, P), int), rng.integers(0, 700, (P, P)),
                np.where(rng.random((P, P)) < 0.4, 0, rng.integers(1, 50, (P, P)))]
    for m in matrices:
        xs = [rng.integers(0, 256, int(m[r].sum()), dtype=np.uint8) for r in range(P)]
        outs = run("alltoallv", P, xs, send_bytes=m.tolist(), chunk_bytes=64, max_frame=100)
        for r in range(P):
            blocks = []
            for p in range(P):
                start = int(m[p, :r].sum())
                blocks.append(xs[p][start:start + int(m[p, r])])
            assert outs[r] == np.concatenate(blocks).tobytes(), f"matrix {m.tolist()} rank {r}"


@pytest.mark.parametrize("P", RANKS)
def test_reducescatter_uneven_counts_every_dtype_op(P):
    rng = np.random.default_rng(50 + P)
    layouts = [[0] * P, [1] * P, [(r * 7) % 4 for r in range(P)], [int(c) for c in rng.integers(0, 300, P)]]
    for name in DTYPES:
        for op in OPS:
            for i, counts in enumerate(layouts):
                alias = i % 2 == 1
                total = sum(counts)
                xs = [gen(name, total, rng) for _ in range(P)]
                outs = outputs_as(run("reducescatter", P, xs, dtype=code(name), op=op_code(op), counts=counts,
                                      alias=alias, chunk_bytes=24, max_frame=40), name)
                want = reduce_ref(xs, name, op)
                at = 0
                for r in range(P):
                    assert np.array_equal(outs[r], want[at:at + counts[r]]), f"{name} {op} {counts} rank {r}"
                    at += counts[r]


@pytest.mark.parametrize("P", (1,) + RANKS)
def test_barrier_waits_for_the_last_rank(P, transport):
    late = P - 1
    res = T.run_collective("barrier", P, [b""] * P, delay_rank=late, delay_ms=150, transport=transport)
    assert res["errors"] == [None] * P
    for r in range(P):
        assert res["exit"][r] >= res["enter"][late], f"rank {r} left the barrier before rank {late} entered"
    assert res["wall"] < 5


def test_large_allreduce_multi_step_multi_frame():
    # Crosses the small-frame threshold and several frames per block with reduction pieces.
    rng = np.random.default_rng(7)
    for P in (2, 3):
        xs = [rng.integers(-1000, 1000, 300_001).astype(np.float32) for _ in range(P)]
        outs = outputs_as(run("allreduce", P, xs, chunk_bytes=65536, max_frame=100_000), "float32")
        want = np.sum(np.stack(xs), 0)
        for o in outs:
            assert np.array_equal(o, want)


# (hosts, ranks per host): the hierarchical allreduce and allgather, as on hosts of consecutive ranks
HOSTS = [(2, 2), (2, 3), (3, 2)]


@pytest.mark.parametrize("H,L", HOSTS)
def test_hierarchical_allreduce_every_dtype_op_size(H, L):
    P = H * L
    rng = np.random.default_rng(100 + P)
    for name in DTYPES:
        for i, op in enumerate(OPS):
            if name == "bfloat16" and op == "Product" and P > 5:
                continue  # products of 6 values up to 3 in size do not all fit bfloat16's 8 bits
            for j, (n, chunk, frame) in enumerate(SHAPES):
                alias = (i + j) % 2 == 1
                xs = [gen(name, n, rng) for _ in range(P)]
                outs = outputs_as(run("allreduce", P, xs, dtype=code(name), op=op_code(op), alias=alias,
                                      chunk_bytes=chunk, max_frame=frame, local_size=L), name)
                want = reduce_ref(xs, name, op)
                for r, o in enumerate(outs):
                    assert np.array_equal(o, want), f"{H}x{L} {name} {op} n={n} rank {r}: {o[:8]} != {want[:8]}"


@pytest.mark.parametrize("H,L", HOSTS)
def test_hierarchical_allgatherv_uneven_contributions(H, L):
    P = H * L
    rng = np.random.default_rng(200 + P)
    for alias in (False, True):
        for sizes in ([0] * P, [(r * 37) % 11 for r in range(P)], [5000 + r for r in range(P)]):
            xs = [rng.integers(0, 255, size=s, dtype=np.uint8) for s in sizes]
            outs = run("allgatherv", P, xs, alias=alias, chunk_bytes=512, max_frame=1024, local_size=L)
            want = b"".join(x.tobytes() for x in xs)
            for r, o in enumerate(outs):
                assert o == want, f"{H}x{L} sizes {sizes} alias {alias} rank {r}"
