"""Worker bodies: every collective x dtype x size (0, 1, odd, large) against torch references,
in-place/async/grouped variants, scale factors, argument errors, and autograd gradients."""
from __future__ import annotations

import time
import warnings

import torch

from _torch_common import DTYPES, FLOATS, LARGE, SIZES, block, check, data, expect_raises, ref_reduce


def _ops(hvd, dt):
    ops = [hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product]
    return ops[1:] if dt == torch.bool else ops  # no Average of booleans


def allreduce(hvd):
    P, r = hvd.size(), hvd.rank()
    pending = []
    for dt in DTYPES:
        for op in _ops(hvd, dt):
            for n in SIZES + ["scalar", "2d", "strided"]:
                shape = {"scalar": (), "2d": (3, 5), "strided": (5, 4)}.get(n, (n,))
                case = f"ar/{dt}/{op}/{n}"
                xs = [data(case, p, shape, dt) for p in range(P)]
                if n == "strided":
                    xs = [x.t() for x in xs]  # not contiguous: the adapter stages a copy
                want = ref_reduce(xs, op, hvd)
                exact = not (dt.is_floating_point and op == hvd.Average)
                x = xs[r].clone()
                check(hvd.allreduce(x, op=op), want, f"allreduce {case}", exact)
                check(x, xs[r], f"allreduce {case} left its input alone")
                y = xs[r].clone()
                assert hvd.allreduce_(y, op=op, name=f"inplace.{case}") is y
                check(y, want, f"allreduce_ {case}", exact)
                a, b = xs[r].clone(), xs[r].clone()
                pending.append((hvd.allreduce_async(a, op=op), None, want, exact, case))
                pending.append((hvd.allreduce_async_(b, op=op, name=f"async_.{case}"), b, want, exact, case))
        for h, same, want, exact, case in reversed(pending):  # completion order is ours to choose
            out = hvd.synchronize(h)
            assert hvd.synchronize(h) is None, "a handle is gone once synchronized (as Horovod)"
            if same is not None:
                assert out is same, f"allreduce_async_ {case} must return its input"
            check(out, want, f"allreduce async {case}", exact)
        pending.clear()

    for dt in FLOATS:  # scale factors (integers: see the integer Average above)
        for op in (hvd.Average, hvd.Sum, hvd.Min, hvd.Max):
            case = f"scale/{dt}/{op}"
            xs = [data(case, p, (33,), dt) for p in range(P)]
            want = ref_reduce(xs, op, hvd, pre=0.5, post=3.0)
            check(hvd.allreduce(xs[r], op=op, prescale_factor=0.5, postscale_factor=3.0), want, case, False)

    # allreduce_async_'s short path (a contiguous host tensor over every rank): its defaults,
    # scale factors, poll, and the refusals it leaves to the general path.
    xs = [data("short", p, (7, 3), torch.float32) for p in range(P)]
    x = xs[r].clone()
    h = hvd.allreduce_async_(x, name="short.default")
    deadline = time.monotonic() + 30
    while not hvd.poll(h):
        assert time.monotonic() < deadline, "poll of an async_ allreduce never turned True"
        time.sleep(0.001)
    assert hvd.synchronize(h) is x
    check(x, ref_reduce(xs, hvd.Average, hvd), "allreduce_async_ defaults to Average", False)
    x = xs[r].clone()
    hvd.synchronize(hvd.allreduce_async_(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3, name="short.scaled"))
    check(x, ref_reduce(xs, hvd.Sum, hvd, pre=0.5, post=3.0), "allreduce_async_ scale factors", False)
    expect_raises(ValueError, lambda: hvd.allreduce_async_(torch.zeros(3, dtype=torch.complex64)), "complex64 (async_)")
    expect_raises(ValueError, lambda: hvd.allreduce_async_(torch.zeros(3), op=99), "unknown op (async_)")
    expect_raises(ValueError, lambda: hvd.allreduce_async_(torch.zeros(3, dtype=torch.int32), op=hvd.Adasum),
                  "Adasum of integers (async_)")

    # allreduce_async of a temporary: the handle keeps the input alive until synchronize. The
    # last rank submits late, so the others read their input long after the caller dropped it,
    # while same-sized tensors of other values are allocated where it would be freed.
    if r == P - 1:
        time.sleep(0.3)
    h = hvd.allreduce_async(torch.full((1000,), float(r + 1)), op=hvd.Sum, name="temporary.input")
    litter = [torch.full((1000,), -7.0) for _ in range(64)]
    check(hvd.synchronize(h), torch.full((1000,), float(P * (P + 1) // 2)), "allreduce_async of a dropped input")
    del litter

    # The deprecated average= argument, exactly as Horovod handles it.
    x = torch.full((4,), float(r + 1))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s = hvd.allreduce(x, average=False)
        a = hvd.allreduce(x, average=True)
    assert any(issubclass(i.category, DeprecationWarning) for i in w), "average= warns"
    check(s, torch.full((4,), float(P * (P + 1) // 2)), "average=False is Sum")
    check(a, torch.full((4,), (P + 1) / 2), "average=True is Average", exact=False)
    check(hvd.allreduce(x), a, "op defaults to Average", exact=False)
    expect_raises(ValueError, lambda: hvd.allreduce(x, average=True, op=hvd.Sum), "average and op together")
    expect_raises(ValueError, lambda: hvd.allreduce_async_(x, average=False, op=hvd.Sum), "average and op (async_)")
    expect_raises(ValueError, lambda: hvd.allreduce(torch.zeros(3, dtype=torch.complex64)), "complex64")
    if P == 1:
        check(hvd.allreduce(x, op=hvd.Adasum), x, "Adasum of one rank is the identity")
    else:  # Adasum itself: test_torch_adasum.py
        expect_raises(ValueError, lambda: hvd.allreduce(x, process_set=hvd.ProcessSet([0])), "unregistered subset")
    check(hvd.allreduce(x, op=hvd.Sum, process_set=hvd.ProcessSet(range(P))), s, "a set of all ranks works")
    expect_raises(ValueError, lambda: hvd.poll(10 ** 9), "poll of an unknown handle")


def grouped(hvd):
    P, r = hvd.size(), hvd.rank()
    for dt in DTYPES:
        for op in _ops(hvd, dt):
            shapes = [(0,), (1,), (17,), (4, 3), (LARGE,)]
            case = f"grouped/{dt}/{op}"
            xs = [[data(f"{case}/{i}", p, s, dt) for p in range(P)] for i, s in enumerate(shapes)]
            wants = [ref_reduce(x, op, hvd) for x in xs]
            exact = not (dt.is_floating_point and op == hvd.Average)
            mine = [x[r].clone() for x in xs]
            outs = hvd.grouped_allreduce(mine, op=op, name=case)
            assert isinstance(outs, list) and len(outs) == len(shapes)
            for o, want, i in zip(outs, wants, range(len(shapes))):
                check(o, want, f"grouped_allreduce {case} [{i}]", exact)
            res = hvd.grouped_allreduce_(mine, op=op)
            for o, m, want in zip(res, mine, wants):
                assert o is m
                check(m, want, f"grouped_allreduce_ {case}", exact)
            h1 = hvd.grouped_allreduce_async([x[r] for x in xs], op=op)
            again = [x[r].clone() for x in xs]
            h2 = hvd.grouped_allreduce_async_(again, op=op)
            deadline = time.monotonic() + 30
            while not hvd.poll(h2):
                assert time.monotonic() < deadline, "poll of a grouped_allreduce_async_ never turned True"
                time.sleep(0.001)
            for h in (h2, h1):
                for o, want in zip(hvd.synchronize(h), wants):
                    check(o, want, f"grouped_allreduce async {case}", exact)
    # (At one rank nothing holds an op in flight: it may complete before the group is tried.)
    if P > 1:
        # A group whose member's name is in flight is refused, naming it (the short path enqueues
        # the whole group in one core call); the op in flight and the runtime go on. The op must
        # still be in flight on the rank that tries the group, so no rank lets it complete before
        # every rank has tried: ranks 1.. hold "busy.0", which rank 0 submits only after the
        # allreduce "tried" (which they join after their refusal); rank 0 holds "hold.0", which
        # ranks 1.. submit only after "tried" (which rank 0 joins after its refusal).
        x, ys = torch.ones(3), [torch.ones(2), torch.ones(4)]
        mine, theirs = ("hold", "busy") if r == 0 else ("busy", "hold")
        held = hvd.allreduce_async_(x, name=f"{mine}.0", op=hvd.Sum)
        e = expect_raises(ValueError, lambda: hvd.grouped_allreduce_async_(ys, name=mine, op=hvd.Sum),
                          "a group member named like an op in flight")
        assert f"{mine}.0" in str(e) and "in flight" in str(e), e
        hvd.allreduce(torch.ones(1), name="tried")
        other = hvd.allreduce_async_(torch.ones(3), name=f"{theirs}.0", op=hvd.Sum)
        check(hvd.synchronize(held), torch.full((3,), float(P)), "the op in flight after a refused group")
        check(hvd.synchronize(other), torch.full((3,), float(P)), "the other rank's op in flight")
        outs = hvd.grouped_allreduce_(ys, name="busy", op=hvd.Sum)
        for o in outs:
            check(o, torch.full(o.shape, float(P)), "the same group once the name is free")
    # grouped allgather / reducescatter
    for dt in DTYPES:
        xs = [[data(f"gag/{dt}/{i}", p, ([p, 1, 2 * p + 3][i], 2), dt) for p in range(P)] for i in range(3)]
        outs = hvd.grouped_allgather([x[r] for x in xs], name=f"gag/{dt}")
        for i, o in enumerate(outs):
            check(o, torch.cat(xs[i]), f"grouped_allgather {dt} [{i}]")
        for op in _ops(hvd, dt):
            dims = [P + 1, 1, 7]
            ys = [[data(f"grs/{dt}/{op}/{i}", p, (d, 3), dt) for p in range(P)] for i, d in enumerate(dims)]
            exact = not (dt.is_floating_point and op == hvd.Average)
            for i, o in enumerate(hvd.grouped_reducescatter([y[r] for y in ys], op=op)):
                start, n = block(dims[i], r, P)
                check(o, ref_reduce(ys[i], op, hvd)[start:start + n], f"grouped_reducescatter {dt} {op} [{i}]", exact)


def allgather(hvd):
    P, r = hvd.size(), hvd.rank()
    cases = {"zero": lambda p: (0, 3), "one": lambda p: (1, 3), "ragged": lambda p: (p, 3),
             "odd": lambda p: (17 + 2 * p, 3), "3d": lambda p: (p + 1, 2, 3), "large": lambda p: (LARGE + p,)}
    for dt in DTYPES:
        pending = []
        for cname, shape_of in cases.items():
            case = f"ag/{dt}/{cname}"
            xs = [data(case, p, shape_of(p), dt) for p in range(P)]
            want = torch.cat(xs)
            x = xs[r].clone()
            check(hvd.allgather(x, name=case), want, f"allgather {case}")
            check(x, xs[r], f"allgather {case} left its input alone")
            pending.append((hvd.allgather_async(xs[r]), want, case))
        for h, want, case in reversed(pending):
            check(hvd.synchronize(h), want, f"allgather_async {case}")
    expect_raises(ValueError, lambda: hvd.allgather(torch.tensor(1.0)), "allgather of a scalar")


def broadcast(hvd):
    P, r = hvd.size(), hvd.rank()
    for dt in DTYPES:
        for root in range(P):
            pending = []
            for n in SIZES + ["2d"]:
                shape = (4, 3) if n == "2d" else (n,)
                case = f"bc/{dt}/{root}/{n}"
                xs = [data(case, p, shape, dt) for p in range(P)]
                x = xs[r].clone()
                check(hvd.broadcast(x, root, name=case), xs[root], f"broadcast {case}")
                check(x, xs[r], f"broadcast {case} left its input alone")
                y = xs[r].clone()
                assert hvd.broadcast_(y, root) is y
                check(y, xs[root], f"broadcast_ {case}")
                z = xs[r].clone()
                pending.append((hvd.broadcast_async(xs[r], root), None, xs[root], case))
                pending.append((hvd.broadcast_async_(z, root_rank=root), z, xs[root], case))
            for h, same, want, case in reversed(pending):
                out = hvd.synchronize(h)
                if same is not None:
                    assert out is same
                check(out, want, f"broadcast async {case}")
    expect_raises(ValueError, lambda: hvd.broadcast(torch.zeros(2), P), "root out of range")
    # the in-place variant writes back into a non-contiguous tensor
    base = torch.zeros(3, 4)
    view = base.t()
    want = data("bc/strided", 0, (4, 3), torch.float32)
    if r == 0:
        view.copy_(want)
    hvd.broadcast_(view, 0)
    check(view.contiguous(), want, "broadcast_ of a strided view")


def _splits_table(P, kind):
    """splits[p][q]: rows rank p sends to rank q."""
    if kind == "skewed":
        return [[(p + 2 * q) % 3 for q in range(P)] for p in range(P)]
    if kind == "large":
        return [[LARGE // P + p + q for q in range(P)] for p in range(P)]
    return [[kind] * P for _ in range(P)]  # equal parts of kind rows


def alltoall(hvd):
    P, r = hvd.size(), hvd.rank()
    for dt in DTYPES:
        for kind in (0, 1, 5, "skewed", "large"):
            table = _splits_table(P, kind)
            trailing = () if kind == "large" else (3,)
            case = f"a2a/{dt}/{kind}"
            xs = [data(case, p, (sum(table[p]),) + trailing, dt) for p in range(P)]

            def expected(me):
                parts = []
                for p in range(P):
                    start = sum(table[p][:me])
                    parts.append(xs[p][start:start + table[p][me]])
                return torch.cat(parts), [table[p][me] for p in range(P)]
            want, want_splits = expected(r)
            if isinstance(kind, int):  # equal parts: splits may be left out; then only the tensor returns
                out = hvd.alltoall(xs[r], name=case)
                check(out, want, f"alltoall {case} without splits")
            out, got_splits = hvd.alltoall(xs[r], splits=table[r])
            check(out, want, f"alltoall {case}")
            check(got_splits, torch.tensor(want_splits, dtype=torch.int32), f"alltoall {case} received splits")
            h = hvd.alltoall_async(xs[r], splits=torch.tensor(table[r], dtype=torch.int64))
            out, got_splits = hvd.synchronize(h)
            check(out, want, f"alltoall_async {case}")
            check(got_splits, torch.tensor(want_splits, dtype=torch.int64), f"alltoall_async {case} splits (int64)")
    x = torch.zeros(P + 1, 2)
    if P > 1:
        expect_raises(ValueError, lambda: hvd.alltoall(x), "alltoall rows not divisible without splits")
    expect_raises(ValueError, lambda: hvd.alltoall(x, splits=[1] * P + [1]), "alltoall splits of wrong length")
    expect_raises(ValueError, lambda: hvd.alltoall(x, splits=[P + 2] + [0] * (P - 1)), "alltoall splits sum")
    # a float splits tensor is refused whatever its values (as Horovod), so every rank refuses it
    y = torch.zeros(P, 2)  # splits of ones would be valid as integers
    expect_raises(ValueError, lambda: hvd.alltoall(y, splits=torch.ones(P)), "float splits")
    expect_raises(ValueError, lambda: hvd.alltoall(y, splits=[1.0] * P), "float splits list")


def reducescatter(hvd):
    P, r = hvd.size(), hvd.rank()
    for dt in DTYPES:
        for op in _ops(hvd, dt):
            pending = []
            for d in (0, 1, P, 17, LARGE):
                shape = (d,) if d == LARGE else (d, 3)
                case = f"rs/{dt}/{op}/{d}"
                xs = [data(case, p, shape, dt) for p in range(P)]
                start, n = block(d, r, P)
                want = ref_reduce(xs, op, hvd)[start:start + n]
                exact = not (dt.is_floating_point and op == hvd.Average)
                check(hvd.reducescatter(xs[r], op=op, name=case), want, f"reducescatter {case}", exact)
                pending.append((hvd.reducescatter_async(xs[r], op=op), want, exact, case))
            for h, want, exact, case in reversed(pending):
                check(hvd.synchronize(h), want, f"reducescatter_async {case}", exact)
    for dt in FLOATS:
        case = f"rs/scale/{dt}"
        xs = [data(case, p, (2 * P + 1, 2), dt) for p in range(P)]
        start, n = block(2 * P + 1, r, P)
        want = ref_reduce(xs, hvd.Average, hvd, pre=0.5, post=3.0)[start:start + n]
        check(hvd.reducescatter(xs[r], prescale_factor=0.5, postscale_factor=3.0), want, case, exact=False)
    x = torch.ones(2 * P, 2)
    check(hvd.reducescatter(x), torch.ones(2, 2), "reducescatter defaults to Average")


def misc(hvd):
    """Errors the runtime reports from other ranks, and synchronisation primitives."""
    P, r = hvd.size(), hvd.rank()
    hvd.barrier()
    if P > 1:
        # Same name, different shapes: every rank gets the mismatch; the runtime goes on.
        e = expect_raises(hvd.MismatchError, lambda: hvd.allreduce(torch.zeros(2 + r), name="mismatched"),
                          "mismatched shapes")
        assert "mismatched" in str(e), f"the error names the tensor: {e}"
        y = torch.zeros(2 + r)  # the same through allreduce_async_'s short path (in place, host)
        e = expect_raises(hvd.MismatchError, lambda: hvd.synchronize(hvd.allreduce_async_(y, name="mismatched.in.place")),
                          "mismatched shapes (allreduce_async_)")
        assert "mismatched.in.place" in str(e), f"the error names the tensor: {e}"
        ys = [torch.ones(3), torch.zeros(2 + r)]  # a group on the short path: one member disagrees
        e = expect_raises(hvd.MismatchError, lambda: hvd.grouped_allreduce_(ys, op=hvd.Sum, name="mismatched.group"),
                          "a mismatched member (grouped_allreduce_)")
        assert "mismatched.group.1" in str(e), f"the error names the member: {e}"
        check(hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after.mismatch"), torch.full((3,), float(P)),
              "usable after a mismatch")
    _synchronize_all(hvd, P, r)
    h = hvd.allreduce_async(torch.ones(5), op=hvd.Sum)
    while not hvd.poll(h):
        pass
    check(hvd.synchronize(h), torch.full((5,), float(P)), "poll then synchronize")
    if r == P - 1:
        import time
        time.sleep(0.3)  # join last
    assert hvd.join() == P - 1, "join returns the rank that joined last"
    hvd.barrier(process_set=hvd.global_process_set)
    # Ranks that have joined take part in the others' allreduces with zeros (Horovod's join).
    if r == 0:
        last = hvd.join()
    else:
        got = hvd.allreduce(torch.full((3,), float(r)), op=hvd.Sum, name="while.rank0.joined")
        check(got, torch.full((3,), float(sum(range(1, P)))), "allreduce while rank 0 has joined")
        last = hvd.join()
    assert hvd.allgather_object(last) == [last] * P, "every rank learns the same last rank"
    assert P == 1 or last != 0, f"rank 0 joined first, yet join() says {last} was last"


def _synchronize_all(hvd, P, r):
    """``synchronize_all``: the results of ``synchronize`` for a mixed batch (host short path in place
    and not, a group, a staged non-contiguous tensor, a broadcast, an unknown handle); with a
    mismatched member, every other operation still completes and every handle is forgotten."""
    from appliance.torch.mpi_ops import synchronize_all
    full = lambda n: torch.full((n,), float(P))  # noqa: E731
    a, g, nc = torch.ones(4), [torch.ones(2), torch.ones(3)], torch.ones(6, 2)[:, 0]
    b = torch.full((3,), float(r))
    hs = [hvd.allreduce_async_(a, op=hvd.Sum, name="all.inplace"), hvd.allreduce_async(torch.ones(5), op=hvd.Sum),
          hvd.grouped_allreduce_async_(g, op=hvd.Sum, name="all.group"), hvd.allreduce_async(nc, op=hvd.Sum),
          hvd.broadcast_async(b, 0, name="all.bcast")]
    outs = synchronize_all(hs)
    assert outs[0] is a and isinstance(outs[2], tuple) and outs[2][0] is g[0], outs
    for o, want, what in zip(outs, [full(4), full(5), None, full(6), torch.zeros(3)],
                             ["in place", "out of place", None, "staged", "broadcast"]):
        if want is not None:
            check(o, want, f"synchronize_all: {what}")
    check(outs[2][1], full(3), "synchronize_all: group member")
    assert all(hvd.synchronize(h) is None for h in hs), "synchronize_all forgets its handles"
    x = torch.ones(2)
    assert synchronize_all([hvd.allreduce_async_(x, op=hvd.Sum), 10 ** 9])[1] is None, "an unknown handle: None"
    if P > 1:  # a mismatched member among good ones: raised once all are done, the others complete
        good, bad = torch.ones(3), torch.zeros(2 + r)
        hs = [hvd.allreduce_async_(good, op=hvd.Sum, name="all.good"),
              hvd.allreduce_async_(bad, op=hvd.Sum, name="all.mismatched"),
              hvd.grouped_allreduce_async_([torch.ones(2)], op=hvd.Sum, name="all.good.group")]
        e = expect_raises(hvd.MismatchError, lambda: synchronize_all(hs), "a mismatched member of synchronize_all")
        assert "all.mismatched" in str(e), e
        check(good, full(3), "synchronize_all: the good op beside a mismatched one")
        assert all(hvd.synchronize(h) is None for h in hs), "synchronize_all forgets its handles after a failure"


CASES = {"allreduce": allreduce, "grouped": grouped, "allgather": allgather, "broadcast": broadcast,
           "alltoall": alltoall, "reducescatter": reducescatter, "misc": misc}
