"""Rank-agnostic worker bodies for tests/runtime/test_engine.py and others (numpy API, real ranks).

Usage: engine.py <case> [args...]. Every rank runs the same body; inputs are derived from
(rank, case) so any rank can rebuild every other rank's input and check results against a
numpy reference. Each rank reports a JSON dict through _report.report.
"""
import os
import signal
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _report import report  # noqa: E402

import appliance.runtime as rt  # noqa: E402
from appliance.runtime import engine  # noqa: E402

INT_TYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64]
FLOAT_TYPES = [np.float16, np.float32, np.float64]
SIZES = [0, 1, 7, 10007]  # 10007 elements cross many 4 KiB chunks (APPLIANCE_CHUNK_BYTES)


def data(rank, dtype, n, salt=0, positive=False):
    g = np.random.RandomState(1000 * rank + 17 * n + salt)
    if dtype == np.bool_:
        return g.randint(0, 2, n).astype(np.bool_)
    lo = 1 if positive else (0 if dtype == np.uint8 else -3)
    return g.randint(lo, 4, n).astype(dtype)


def reference(op, arrays, size):
    stack = np.stack(arrays)
    if stack.dtype == np.bool_:
        return stack.any(0) if op in (rt.Sum, rt.Max) else stack.all(0)
    if op in (rt.Sum, rt.Average):
        s = stack.astype(np.float64).sum(0)
        if op == rt.Average:
            s = np.trunc(s * (1.0 / size)) if np.issubdtype(stack.dtype, np.integer) else s / size
        return s.astype(stack.dtype) if np.issubdtype(stack.dtype, np.integer) else s
    if op == rt.Min:
        return stack.min(0)
    if op == rt.Max:
        return stack.max(0)
    return stack.astype(np.float64).prod(0)


def check(name, got, want, dtype):
    got = np.asarray(got)
    if got.shape != np.shape(want):
        raise AssertionError(f"{name}: shape {got.shape} != {np.shape(want)}")
    tol = 1e-2 if dtype == np.float16 else 1e-6
    if np.issubdtype(np.dtype(dtype), np.floating):
        ok = np.allclose(got.astype(np.float64), np.asarray(want, dtype=np.float64), rtol=tol, atol=tol)
    else:
        ok = np.array_equal(got, np.asarray(want).astype(dtype))
    if not ok:
        raise AssertionError(f"{name}: got {got.ravel()[:8]} want {np.asarray(want).ravel()[:8]}")


def case_ops():
    hosts = int(os.environ.get("APPLIANCE_TEST_HOSTS", "0"))  # simulated hosts of consecutive ranks
    if hosts:
        os.environ["HOROVOD_HOSTNAME"] = f"sim{int(os.environ['HOROVOD_RANK']) * hosts // int(os.environ['HOROVOD_SIZE'])}"
    rt.init()
    r, P = rt.rank(), rt.size()
    n_checked = 0
    for dtype in INT_TYPES + FLOAT_TYPES + [np.bool_]:
        ops = [rt.Sum, rt.Min, rt.Max] if dtype == np.bool_ else [rt.Sum, rt.Average, rt.Min, rt.Max, rt.Product]
        for n in SIZES:
            for op in ops:
                pos = op == rt.Product
                x = data(r, dtype, n, salt=op, positive=pos)
                got = rt.allreduce(x, op=op, name=f"ar.{np.dtype(dtype).name}.{n}.{op}")
                want = reference(op, [data(k, dtype, n, salt=op, positive=pos) for k in range(P)], P)
                check(f"allreduce {np.dtype(dtype).name} n={n} op={op}", got, want, dtype)
                n_checked += 1
            # allgather with uneven first dimensions (rank 0 may contribute no rows)
            rows = lambda k: (k * n) % 5 if n else 0  # noqa: E731
            x = data(r, dtype, rows(r) * 3).reshape(rows(r), 3)
            got = rt.allgather(x, name=f"ag.{np.dtype(dtype).name}.{n}")
            want = np.concatenate([data(k, dtype, rows(k) * 3).reshape(rows(k), 3) for k in range(P)])
            check(f"allgather {np.dtype(dtype).name} n={n}", got, want, dtype)
            # broadcast from every root
            for root in range(P):
                x = data(r, dtype, n, salt=50 + root)
                got = rt.broadcast(x, root_rank=root, name=f"bc.{np.dtype(dtype).name}.{n}.{root}")
                check(f"broadcast {np.dtype(dtype).name} n={n} root={root}", got, data(root, dtype, n, salt=50 + root), dtype)
            # alltoall with uneven splits (incl. zeros)
            splits = lambda k: [((k * 7 + d * 3 + n) % 4) for d in range(P)]  # noqa: E731
            x = data(r, dtype, sum(splits(r)) * 2, salt=7).reshape(-1, 2)
            got, recv = rt.alltoall(x, splits=splits(r), name=f"a2a.{np.dtype(dtype).name}.{n}")
            parts = []
            for s in range(P):
                xs = data(s, dtype, sum(splits(s)) * 2, salt=7).reshape(-1, 2)
                off = sum(splits(s)[:r])
                parts.append(xs[off:off + splits(s)[r]])
            check(f"alltoall {np.dtype(dtype).name} n={n}", got, np.concatenate(parts), dtype)
            assert list(recv) == [splits(s)[r] for s in range(P)], (list(recv), r)
            # reducescatter of an uneven first dimension
            if dtype != np.bool_:
                dim0 = 2 * P + 1 + (n % 3)
                for op in (rt.Sum, rt.Average, rt.Max):
                    x = data(r, dtype, dim0 * 3, salt=90 + op).reshape(dim0, 3)
                    got = rt.reducescatter(x, op=op, name=f"rs.{np.dtype(dtype).name}.{n}.{op}")
                    full = reference(op, [data(k, dtype, dim0 * 3, salt=90 + op).reshape(dim0, 3) for k in range(P)], P)
                    lo = sum(dim0 // P + (k < dim0 % P) for k in range(r))
                    mine = dim0 // P + (r < dim0 % P)
                    check(f"reducescatter {np.dtype(dtype).name} op={op}", got, full[lo:lo + mine], dtype)
    # scale factors
    x = data(r, np.float32, 33)
    got = rt.allreduce(x, op=rt.Sum, name="scaled", prescale_factor=0.5, postscale_factor=4.0)
    check("scaled allreduce", got, 2.0 * sum(data(k, np.float32, 33) for k in range(P)), np.float32)
    check("input of a scaled allreduce", x, data(r, np.float32, 33), np.float32)
    # ring-sized (over 1 MiB), out of place: reduced from the input, which stays as it was
    x = data(r, np.float32, 1 << 19)
    got = rt.allreduce(x, op=rt.Sum, name="ring.out")
    check("ring-sized allreduce", got, sum(data(k, np.float32, 1 << 19) for k in range(P)), np.float32)
    check("input of a ring-sized allreduce", x, data(r, np.float32, 1 << 19), np.float32)
    x = data(r, np.int32, 33)
    got = rt.allreduce(x, op=rt.Sum, name="scaled.int", prescale_factor=3.0)
    check("scaled int allreduce", got, 3 * sum(data(k, np.int32, 33).astype(np.int64) for k in range(P)), np.int32)
    # bfloat16 through the low-level engine API: bit patterns of small integers
    vals = data(r, np.float32, 65)
    bits = (vals.view(np.uint32) >> 16).astype(np.uint16)
    out = np.empty_like(bits)
    h = engine.current().submit(engine.request(engine.Kind.ALLREDUCE, rt.Sum), "bf16",
                                engine.TensorDesc(bits.ctypes.data, engine.DType.BFLOAT16, bits.shape, out.ctypes.data))
    engine.current().wait(h)
    got = (out.astype(np.uint32) << 16).view(np.float32)
    check("bfloat16 allreduce", got, sum(data(k, np.float32, 65) for k in range(P)), np.float32)
    # grouped allreduce
    xs = [data(r, np.float32, n, salt=3) for n in (5, 0, 300)]
    got = rt.grouped_allreduce(xs, op=rt.Sum, name="grp")
    for i, n in enumerate((5, 0, 300)):
        check(f"grouped[{i}]", got[i], sum(data(k, np.float32, n, salt=3) for k in range(P)), np.float32)
    rt.barrier()
    report({"ok": True, "checked": n_checked, "size": P, "local_rank": rt.local_rank(), "local_size": rt.local_size(),
            "cross_rank": rt.cross_rank(), "cross_size": rt.cross_size()})


def case_order():
    """Each rank submits the same names in a different order; all complete correctly."""
    rt.init()
    r, P = rt.rank(), rt.size()
    names = [f"t{i}" for i in range(24)]
    order = list(names)
    if r % 3 == 1:
        order.reverse()
    elif r % 3 == 2:
        np.random.RandomState(r).shuffle(order)
    pending = {}
    for nm in order:
        i = int(nm[1:])
        if i % 3 == 0:
            pending[nm] = rt.allreduce_async(data(r, np.float32, 100 + i, salt=i), op=rt.Sum, name=nm)
        elif i % 3 == 1:
            pending[nm] = rt.allgather_async(data(r, np.int32, 4 * (r + 1), salt=i).reshape(-1, 4), name=nm)
        else:
            pending[nm] = rt.broadcast_async(data(r, np.int64, 9, salt=i), root_rank=i % P, name=nm)
    for nm in reversed(order):
        i = int(nm[1:])
        got = rt.synchronize(pending[nm])
        if i % 3 == 0:
            check(nm, got, sum(data(k, np.float32, 100 + i, salt=i) for k in range(P)), np.float32)
        elif i % 3 == 1:
            check(nm, got, np.concatenate([data(k, np.int32, 4 * (k + 1), salt=i).reshape(-1, 4) for k in range(P)]), np.int32)
        else:
            check(nm, got, data(i % P, np.int64, 9, salt=i), np.int64)
    report({"ok": True, "order": order})


def case_mismatch():
    """Every kind of disagreement raises MismatchError on every rank; the runtime goes on."""
    rt.init()
    r, P = rt.rank(), rt.size()
    odd = r == P - 1
    cases = {
        "shape": lambda: rt.allreduce(np.ones((2, 4 if odd else 3), np.float32), name="m.shape"),
        "dtype": lambda: rt.allreduce(np.ones(5, np.float64 if odd else np.float32), name="m.dtype"),
        "op": lambda: rt.allreduce(np.ones(5, np.float32), op=rt.Max if odd else rt.Sum, name="m.op"),
        "root": lambda: rt.broadcast(np.ones(5, np.float32), root_rank=1 if odd else 0, name="m.root"),
        "gather": lambda: rt.allgather(np.ones((2, 3 if odd else 2), np.int32), name="m.gather"),
        "kind": lambda: (rt.allgather(np.ones((2, 2)), name="m.kind") if odd else rt.allreduce(np.ones((2, 2)), name="m.kind")),
        "scale": lambda: rt.allreduce(np.ones(5, np.float32), name="m.scale", prescale_factor=2.0 if odd else 1.0),
    }
    messages = {}
    for key, fn in cases.items():
        try:
            fn()
            messages[key] = None
        except rt.MismatchError as e:
            messages[key] = str(e)
        # still usable after each failure
        check(f"after {key}", rt.allreduce(np.full(3, r, np.float32), op=rt.Sum, name=f"after.{key}"),
              np.full(3, sum(range(P)), np.float32), np.float32)
    report({"messages": messages, "odd": P - 1})


def case_duplicate():
    """A name in flight cannot be submitted again; free once done. Rank r's own name cannot
    complete before its duplicate attempt: no other rank submits it until after the barrier
    that every rank enters only after its attempt (a name is freed when its op completes, so a
    first op that finished early would let the "duplicate" through)."""
    rt.init()
    r, P = rt.rank(), rt.size()
    mine = f"dup.{r}"
    h = rt.allreduce_async(np.ones(4, np.float32), op=rt.Sum, name=mine)
    err = None
    try:
        rt.allreduce_async(np.ones(4, np.float32), op=rt.Sum, name=mine)
    except ValueError as e:
        err = str(e)
    rt.barrier()
    others = [rt.allreduce_async(np.ones(4, np.float32), op=rt.Sum, name=f"dup.{j}") for j in range(P) if j != r]
    for got in [rt.synchronize(h)] + [rt.synchronize(o) for o in others]:
        check("first dup", got, np.full(4, P, np.float32), np.float32)
    # the names are free again once completed
    check("reuse", rt.allreduce(np.ones(4, np.float32), op=rt.Sum, name="dup.0"), np.full(4, P, np.float32), np.float32)
    report({"error": err, "name": mine})


def case_die(victim, when):
    """`victim` is SIGKILLed (idle or in the middle of collectives); survivors report the error."""
    victim = int(victim)
    rt.init()
    r, P = rt.rank(), rt.size()
    out = os.environ["APPLIANCE_TEST_OUT"]
    rt.barrier()
    if r == victim:
        def die():
            with open(os.path.join(out, "victim_died_at"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if when == "idle":
            time.sleep(0.5)
            die()
        threading.Timer(0.3, die).start()
        x = np.ones(1 << 22, np.float32)
        while True:
            rt.allreduce(x, op=rt.Sum, name="big")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # report even while the launcher stops us
    started = time.time()
    try:
        if when == "idle":
            rt.allreduce(np.ones(8, np.float32), op=rt.Sum, name="never")
        else:
            x = np.ones(1 << 22, np.float32)
            while time.time() - started < 60:
                rt.allreduce(x, op=rt.Sum, name="big")
        report({"error": None})
    except rt.HorovodInternalError as e:
        report({"error": str(e), "type": type(e).__name__, "origin_rank": e.origin_rank, "at": time.time(),
                "started": started})
    # afterwards every call fails fast with the same cause
    try:
        rt.allreduce(np.ones(2, np.float32), name="after")
    except rt.HorovodInternalError:
        pass
    os._exit(0)


def case_single():
    rt.init()
    assert (rt.size(), rt.rank(), rt.local_size(), rt.local_rank(), rt.cross_size(), rt.cross_rank()) == (1, 0, 1, 0, 1, 0)
    x = np.arange(10, dtype=np.float32)
    check("single allreduce", rt.allreduce(x), x, np.float32)
    check("single allgather", rt.allgather(x.reshape(5, 2)), x.reshape(5, 2), np.float32)
    check("single broadcast", rt.broadcast(x, 0), x, np.float32)
    got, splits = rt.alltoall(x)
    check("single alltoall", got, x, np.float32)
    check("single reducescatter", rt.reducescatter(x.reshape(5, 2), op=rt.Sum), x.reshape(5, 2), np.float32)
    rt.barrier()
    assert rt.join() == 0
    rt.shutdown()
    report({"ok": True})


def case_reinit():
    for round_ in range(3):
        rt.init()
        P = rt.size()
        check(f"round {round_}", rt.allreduce(np.ones(6, np.float32), op=rt.Sum, name="x"), np.full(6, P, np.float32), np.float32)
        # links opened on first use, again in each round: a broadcast tree rooted at the last rank, an allgather
        x = np.full(3, rt.rank() + round_, np.float32)
        check(f"round {round_} broadcast", rt.broadcast(x, root_rank=P - 1, name="b"),
              np.full(3, P - 1 + round_, np.float32), np.float32)
        check(f"round {round_} allgather", rt.allgather(x[:1], name="g"),
              np.arange(P, dtype=np.float32) + round_, np.float32)
        rt.shutdown()
        assert not rt.is_initialized()
    report({"ok": True})


def case_stats(n):
    """n small allreduces submitted at once, then the same again: fusion and cache counters; then
    once more with the negotiation's profiling on."""
    n = int(n)
    rt.init()
    e = engine.current()
    def step():
        hs = [rt.allreduce_async(np.full(10, i, np.float32), op=rt.Sum, name=f"g{i}") for i in range(n)]
        for i, h in enumerate(hs):
            check(f"g{i}", rt.synchronize(h), np.full(10, i * rt.size(), np.float32), np.float32)
    step()
    first = dict(e.core.stats())
    step()
    second = dict(e.core.stats())
    e.core.set_profiling(True)
    step()
    e.core.set_profiling(False)
    profiled = dict(e.core.stats())
    report({"first": first, "second": second, "profiled": profiled})


def case_drive(n):
    """n synchronous small allreduces, then a burst of n async ones: results, and how many plans
    the waiting callers ran themselves (APPLIANCE_SPIN_US)."""
    n = int(n)
    rt.init()
    P = rt.size()
    e = engine.current()
    rt.barrier()
    before = e.core.stats()["driven_plans"]
    for i in range(n):
        check(f"sync{i}", rt.allreduce(np.full(1024, i, np.float32), op=rt.Sum, name="sync"),
              np.full(1024, i * P, np.float32), np.float32)
    sync_driven = e.core.stats()["driven_plans"] - before
    hs = [rt.allreduce_async(np.full(10, i, np.float32), op=rt.Sum, name=f"b{i}") for i in range(n)]
    for i, h in enumerate(hs):
        check(f"b{i}", rt.synchronize(h), np.full(10, i * P, np.float32), np.float32)
    report({"ok": True, "sync_driven": sync_driven, "stats": dict(e.core.stats())})


def case_threads(n):
    """Three caller threads per rank at once, each with its own names: two synchronous loops of
    small allreduces and allgathers (callers that drive the engine, often together) and one
    of async bursts (left to the background thread). Every result checked."""
    n = int(n)
    rt.init()
    r, P = rt.rank(), rt.size()
    errors = []

    def sync_allreduce():
        for i in range(n):
            got = rt.allreduce(data(r, np.float32, 300, salt=i), op=rt.Sum, name="ta")
            check(f"ta{i}", got, sum(data(k, np.float32, 300, salt=i) for k in range(P)), np.float32)

    def sync_allgather():
        for i in range(n):
            got = rt.allgather(data(r, np.int32, 6, salt=i).reshape(-1, 2), name="tg")
            check(f"tg{i}", got, np.concatenate([data(k, np.int32, 6, salt=i).reshape(-1, 2) for k in range(P)]), np.int32)

    def bursts():
        for i in range(max(1, n // 20)):
            hs = [rt.allreduce_async(np.full(8, j + i, np.float64), op=rt.Sum, name=f"tb{j}") for j in range(20)]
            for j, h in enumerate(hs):
                check(f"tb{j}.{i}", rt.synchronize(h), np.full(8, (j + i) * P, np.float64), np.float64)

    def run(fn):
        try:
            fn()
        except BaseException as e:  # reported below, with the thread that met it
            errors.append(f"{fn.__name__}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(fn,)) for fn in (sync_allreduce, sync_allgather, bursts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report({"ok": not errors, "errors": errors, "driven": engine.current().core.stats()["driven_plans"]})


def case_links():
    """Which transport each data link uses, and a large allreduce over it (many ring laps)."""
    rt.init()
    kinds = engine.link_kinds()
    x = data(rt.rank(), np.float32, 3_000_001)
    got = rt.allreduce(x, op=rt.Sum, name="big")
    check("big", got, reference(rt.Sum, [data(r, np.float32, 3_000_001) for r in range(rt.size())], rt.size()),
          np.float32)
    report({"links": kinds, "ok": True})


def case_outputs():
    """Large core-allocated outputs (allgather, alltoall, reducescatter) recycled through the
    output pool: an output still referenced is never reused (its contents survive the next ops),
    a dropped one is; and an in-place broadcast (out=a)."""
    rt.init()
    r, P = rt.rank(), rt.size()
    n = 300_000  # 1.2 MB per rank: over the pool's 1 MiB floor
    def gathered(salt):
        return np.concatenate([data(k, np.float32, n, salt) for k in range(P)])
    kept = [rt.allgather(data(r, np.float32, n, s), name=f"ag{s}") for s in range(3)]
    for s, out in enumerate(kept):  # all three alive together: three distinct blocks
        check(f"ag{s} kept", out, gathered(s), np.float32)
    reused_before = engine.current().core.stats()["outputs_reused"]
    for s in range(3, 9):  # each output dropped before the next: blocks come back from the pool
        check(f"ag{s}", rt.allgather(data(r, np.float32, n, s), name="ag"), gathered(s), np.float32)
        a2a, splits = rt.alltoall(data(r, np.float32, n * P, s), name="a2a")
        want = np.concatenate([data(k, np.float32, n * P, s)[r * n:(r + 1) * n] for k in range(P)])
        check(f"a2a{s}", a2a, want, np.float32)
        rs = rt.reducescatter(data(r, np.float32, n * P, s), op=rt.Sum, name="rs")
        check(f"rs{s}", rs, reference(rt.Sum, [data(k, np.float32, n * P, s) for k in range(P)], P)[r * n:(r + 1) * n],
              np.float32)
    for s, out in enumerate(kept):  # untouched by the ops that reused memory
        check(f"ag{s} after reuse", out, gathered(s), np.float32)
    stats = engine.current().core.stats()
    b = data(r, np.float32, n, 99)
    got = rt.broadcast(b, 1 % P, name="bc", out=b)
    check("broadcast in place", b, data(1 % P, np.float32, n, 99), np.float32)
    report({"reused": stats["outputs_reused"] - reused_before, "idle": stats["outputs_idle_bytes"],
            "in_place": got is b, "ok": True})


def case_submit_api():
    """The core's one way in and out (engine.submit / engine.wait), as adapters use it: what wait
    hands back per kind, groups in one call, and a refused group member naming the members
    enqueued before it."""
    rt.init()
    r, P = rt.rank(), rt.size()
    e = engine.current()
    out = {"ok": True}
    total = engine.request(engine.Kind.ALLREDUCE, rt.Sum)
    assert engine.request(engine.Kind.ALLREDUCE, rt.Sum) is total  # one Request per combination
    a = np.full(5, r + 1, np.float32)
    out["allreduce"] = e.wait(e.submit(total, "api.ar", engine.describe(a, a)))
    check("api.ar", a, np.full(5, P * (P + 1) / 2), np.float32)
    g = np.full((r + 1, 2), r, np.int32)
    res = e.wait(e.submit(engine.request(engine.Kind.ALLGATHER), "api.ag", engine.describe(g)))
    out["allgather"] = [type(res).__name__, list(res.shape)]
    # a group: one call in, one call out (None: nothing to hand back)
    xs = [np.full(n, r + 1.0, np.float64) for n in (3, 0, 7)]
    hs = e.submit(total, ["api.g.0", None, "api.g.2"], [engine.describe(x, x) for x in xs])
    out["group_handles"] = len(hs)
    out["group_wait"] = e.wait(hs)
    for x in xs:
        check("api.g", x, np.full(x.shape, P * (P + 1) / 2), np.float64)
    gs = [np.full((2, 1), r, np.int64), np.full((1, 3), r, np.float32)]
    res = e.wait(e.submit(engine.request(engine.Kind.ALLGATHER), ["api.gg.0", "api.gg.1"],
                          [engine.describe(x) for x in gs]))
    out["gathered_group"] = [list(x.shape) for x in res]
    out["empty_group"] = [e.submit(total, [], []), e.wait([])]
    try:
        e.submit(total, "api.bad", (a.ctypes.data, engine.DType.FLOAT32))
        out["malformed"] = None
    except TypeError as exc:
        out["malformed"] = str(exc)
    # a refused member: the members before it are enqueued (their memory must outlive them)
    b = np.ones(4, np.float32)
    try:
        e.submit(total, ["api.r.0", "api.r.1"], [engine.describe(b, b), (b.ctypes.data, engine.DType.FLOAT32, (-1,), 0)])
        out["refused"] = None
    except ValueError as exc:
        out["refused"] = [str(exc), exc.handles, e.poll(exc.handles)]
    rt.barrier()  # no rank shuts down (failing the other's pending member) before every rank polled
    report(out)
    rt.shutdown()


def case_join():
    rt.init()
    r, P = rt.rank(), rt.size()
    mine = 2 * (r + 1)
    for i in range(mine):
        got = rt.allreduce(np.ones(5, np.float32), op=rt.Sum, name=f"j{i}")
        want = sum(1 for k in range(P) if 2 * (k + 1) > i)
        check(f"join step {i}", got, np.full(5, want, np.float32), np.float32)
    last = rt.join()
    # and the job goes on normally afterwards
    check("after join", rt.allreduce(np.ones(2, np.float32), op=rt.Sum, name="post"), np.full(2, P, np.float32), np.float32)
    report({"last": last})


if __name__ == "__main__":
    globals()["case_" + sys.argv[1]](*sys.argv[2:])
