"""Cases for tf_hvd.py: every collective x dtype x a few shapes, eagerly and inside
tf.function, against numpy; grouped allreduce; IndexedSlices; the scalar ops; gradients; calls
before init. APPLIANCE_TEST_TF_ALTERNATE=1: the dtype sweeps (allreduce, allgather, broadcast) run
each combination in one mode, eager and tf.function alternating, so every dtype and op still meets
both modes (a second size needs the sizes' checks, not the tracing's again)."""
import os

import numpy as np
import tensorflow as tf

DTYPES = [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64]
SHAPES = [(), (0,), (7,), (3, 5)]


def data(rank, dtype, shape, salt=0):
    g = np.random.RandomState(1000 * rank + 37 * salt + 7 * len(shape) + sum(shape))
    lo = 0 if dtype in (tf.uint8, tf.bool) else -3
    a = g.randint(lo, 4, shape)
    if dtype == tf.bool:
        return a.astype(bool)
    return a.astype(np.float32 if dtype == tf.bfloat16 else dtype.as_numpy_dtype)


def reference(hvd, op, arrays):
    stack = np.stack(arrays).astype(np.float64)
    if op == hvd.Sum:
        return stack.sum(0)
    if op == hvd.Average:
        return stack.sum(0) / len(arrays)
    if op == hvd.Min:
        return stack.min(0)
    if op == hvd.Max:
        return stack.max(0)
    return stack.prod(0)


def close(got, want, dtype, what):
    got = np.asarray(tf.cast(got, tf.float64) if dtype == tf.bfloat16 else got, np.float64)
    want = np.asarray(want, np.float64)
    if dtype.is_integer:
        want = np.trunc(want)
        if dtype in (tf.uint8, tf.int8, tf.int16):  # wrap-around of the narrow types
            bits = dtype.size * 8
            want = want.astype(np.int64) % (1 << bits)
            got = got.astype(np.int64) % (1 << bits)
    tol = 0.05 if dtype in (tf.float16, tf.bfloat16) else 1e-6
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert np.allclose(got, want, rtol=tol, atol=tol), (what, got.ravel()[:6], want.ravel()[:6])


ALTERNATE = os.environ.get("APPLIANCE_TEST_TF_ALTERNATE") == "1"


def modes(fn, i=None):
    """fn eagerly, and fn inside a tf.function; for combination ``i`` of a sweep under
    APPLIANCE_TEST_TF_ALTERNATE=1, only one of them (by the parity of ``i``)."""
    both = [("eager", fn), ("function", tf.function(fn))]
    return both if i is None or not ALTERNATE else [both[i % 2]]


def case_allreduce(hvd):
    rank, size = hvd.rank(), hvd.size()
    checked, combination = 0, 0
    for dtype in DTYPES:
        ops = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product] if dtype.is_floating else [hvd.Sum, hvd.Min, hvd.Max]
        for shape in SHAPES:
            for op in ops:  # 5 and 3 ops: an odd step, so each (dtype, op) alternates over the shapes
                mine = tf.constant(data(rank, dtype, shape, op), dtype=dtype)
                want = reference(hvd, op, [data(r, dtype, shape, op) for r in range(size)])
                combination += 1
                for mode, fn in modes(lambda t: hvd.allreduce(t, op=op, name=f"ar.{dtype.name}.{op}"), combination):
                    close(fn(mine), want, dtype, f"allreduce {mode} {dtype.name} {shape} op {op}")
                    checked += 1
    # prescale and postscale
    x = tf.constant(data(rank, tf.float64, (5,)), tf.float64)
    want = reference(hvd, hvd.Sum, [data(r, tf.float64, (5,)) for r in range(size)]) * 2 * 0.25
    for mode, fn in modes(lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)):
        close(fn(x), want, tf.float64, f"scaled allreduce {mode}")
    return {"allreduce_checked": checked}


def case_grouped_allreduce(hvd):
    rank, size = hvd.rank(), hvd.size()
    shapes = [(3,), (2, 2), (0,), (11,)]
    mine = [tf.constant(data(rank, tf.float32, s, i), tf.float32) for i, s in enumerate(shapes)]
    wants = [reference(hvd, hvd.Average, [data(r, tf.float32, s, i) for r in range(size)]) for i, s in enumerate(shapes)]
    for mode, fn in modes(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Average)):
        for i, (got, want) in enumerate(zip(fn(mine), wants)):
            close(got, want, tf.float32, f"grouped allreduce {mode} member {i}")


def case_allgather(hvd):
    rank, size = hvd.rank(), hvd.size()
    for d, dtype in enumerate(DTYPES + [tf.bool]):
        for k, tail in enumerate([(), (4,), (2, 3)]):
            def shape_of(r):
                return (r + 1,) + tail
            mine = tf.constant(data(rank, dtype, shape_of(rank)), dtype=dtype)
            want = np.concatenate([data(r, dtype, shape_of(r)) for r in range(size)])
            for mode, fn in modes(lambda t: hvd.allgather(t), d + k):
                got = fn(mine)
                if dtype == tf.bool:
                    assert np.array_equal(got.numpy(), want), (mode, tail)
                else:
                    close(got, want, dtype, f"allgather {mode} {dtype.name} {tail}")
    # a rank with no rows
    empty = tf.zeros((0 if rank == 0 else 2, 3), tf.float32)
    got = hvd.allgather(empty)
    assert got.shape == (2 * (size - 1), 3), got.shape


def case_broadcast(hvd):
    rank, size = hvd.rank(), hvd.size()
    for d, dtype in enumerate(DTYPES + [tf.bool]):
        for k, shape in enumerate(SHAPES):
            for root in sorted({0, size - 1}):
                mine = tf.constant(data(rank, dtype, shape), dtype=dtype)
                for mode, fn in modes(lambda t: hvd.broadcast(t, root), d + k + root):
                    got = fn(mine).numpy()
                    want = data(root, dtype, shape)
                    if dtype == tf.bool:
                        assert np.array_equal(got, want), (mode, shape, root)
                    else:
                        close(got, want, dtype, f"broadcast {mode} {dtype.name} {shape} root {root}")
    v = tf.Variable(tf.fill([4], float(rank)))
    hvd.broadcast_variables([v], root_rank=size - 1)
    assert np.all(v.numpy() == size - 1), v.numpy()
    vs = [tf.Variable(tf.fill([3], float(rank))), tf.Variable(tf.fill([2, 2], tf.constant(rank, tf.int64)))]
    got = hvd.broadcast_(vs, root_rank=0)
    assert all(np.all(x.numpy() == 0) for x in got) and all(np.all(x.numpy() == 0) for x in vs), got
    obj = {"from": rank, "list": list(range(rank + 2))} if rank == size - 1 else None
    assert hvd.broadcast_object(obj, root_rank=size - 1) == {"from": size - 1, "list": list(range(size + 1))}
    assert hvd.allgather_object(("r", rank) * (rank + 1)) == [("r", r) * (r + 1) for r in range(size)]


def case_indexed_slices(hvd):
    rank, size = hvd.rank(), hvd.size()
    s = tf.IndexedSlices(tf.constant([[float(rank)] * 3], tf.float32), tf.constant([rank], tf.int64),
                         dense_shape=tf.constant([size, 3], tf.int64))
    for op in (hvd.Sum, hvd.Average):
        for mode, fn in modes(lambda t: hvd.allreduce(t, op=op)):
            got = fn(s)
            assert isinstance(got, tf.IndexedSlices), type(got)
            assert np.array_equal(got.indices.numpy(), np.arange(size)), got.indices
            want = np.arange(size, dtype=np.float32)[:, None].repeat(3, 1) / (size if op == hvd.Average else 1)
            close(got.values, want, tf.float32, f"IndexedSlices {mode} op {op}")


def case_scalars(hvd):
    for mode, fn in modes(lambda: (hvd.size_op(), hvd.rank_op(), hvd.local_rank_op(), hvd.local_size_op(),
                                   hvd.process_set_included_op())):
        got = [int(x) for x in fn()]
        assert got == [hvd.size(), hvd.rank(), hvd.local_rank(), hvd.local_size(), 1], (mode, got)


def case_gradients(hvd):
    rank, size = hvd.rank(), hvd.size()
    x = tf.Variable(tf.constant(data(rank, tf.float32, (4,), 3), tf.float32))

    def grads():
        with tf.GradientTape(persistent=True) as tape:
            ar = hvd.allreduce(x, op=hvd.Sum)
            ag = hvd.allgather(tf.reshape(x, [2, 2]))
            bc = hvd.broadcast(x, 0)
            losses = [tf.reduce_sum(ar * 2.0), tf.reduce_sum(ag * 3.0), tf.reduce_sum(bc * 5.0)]
        return [tape.gradient(loss, x) for loss in losses]

    for mode, fn in modes(grads):
        ar, ag, bc = (g.numpy() for g in fn())
        assert np.allclose(ar, 2.0 * size), (mode, ar)      # the gradient of a Sum allreduce is one
        assert np.allclose(ag, 3.0), (mode, ag)             # averaged over the ranks, this rank's rows
        assert np.allclose(bc, 5.0 if rank == 0 else 0.0), (mode, bc)


def case_reducescatter(hvd):
    rank, size = hvd.rank(), hvd.size()
    for dtype in (tf.int32, tf.float32, tf.float64):
        for rows in (size, 7):
            shape = (rows, 3)
            mine = tf.constant(data(rank, dtype, shape), dtype=dtype)
            counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
            start = sum(counts[:rank])
            for op in (hvd.Sum, hvd.Average) if dtype.is_floating else (hvd.Sum,):
                want = reference(hvd, op, [data(r, dtype, shape) for r in range(size)])[start:start + counts[rank]]
                for mode, fn in modes(lambda t: hvd.reducescatter(t, op=op)):
                    close(fn(mine), want, dtype, f"reducescatter {mode} {dtype.name} rows {rows} op {op}")
    x = tf.Variable(tf.ones([size * 2, 2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.reducescatter(x, op=hvd.Average) * 3.0)
    assert np.allclose(tape.gradient(loss, x).numpy(), 3.0), tape.gradient(loss, x)


def case_alltoall(hvd):
    rank, size = hvd.rank(), hvd.size()
    for dtype in (tf.uint8, tf.int64, tf.float16, tf.float32, tf.bool):
        # rank r sends (r + d + 1) rows to rank d, each row filled with (r, d)
        def rows(src):
            return [src + d + 1 for d in range(size)]
        mine = np.concatenate([np.full((n, 2), 10 * rank + d) for d, n in enumerate(rows(rank))])
        want = np.concatenate([np.full((rows(s)[rank], 2), 10 * s + rank) for s in range(size)])
        if dtype == tf.bool:
            mine, want = mine % 2 == 1, want % 2 == 1
        for mode, fn in modes(lambda t, sp: hvd.alltoall(t, splits=sp)):
            out, received = fn(tf.constant(mine, dtype=dtype), tf.constant(rows(rank), tf.int32))
            assert np.array_equal(out.numpy().astype(want.dtype), want), (mode, dtype.name, out.numpy()[:3])
            assert received.numpy().tolist() == [rows(s)[rank] for s in range(size)], (mode, received)
    even = tf.constant(np.arange(size * 2, dtype=np.float32) + 100 * rank)
    got = hvd.alltoall(even).numpy()  # no splits: an even split, the output alone
    assert np.array_equal(got, np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * s for s in range(size)])), got
    x = tf.Variable(tf.ones([size, 2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.alltoall(x, splits=[1] * size)[0] * 2.0)
    assert np.allclose(tape.gradient(loss, x).numpy(), 2.0), tape.gradient(loss, x)


def case_join(hvd):
    """The last rank joins after allreducing twice; the others see zeros from joined ranks and
    every rank learns who joined last."""
    rank, size = hvd.rank(), hvd.size()
    if rank == size - 1:
        for _ in range(2):
            got = hvd.allreduce(tf.ones([3]), op=hvd.Sum, name="joined").numpy()
            assert np.allclose(got, 1.0), got  # every other rank has joined: their zeros
    last = int(hvd.join())
    assert last == size - 1, last


def case_process_sets(hvd):
    """A set of the even ranks (added dynamically): its collectives, eager and in tf.function,
    and its scalar ops; the odd ranks see themselves outside it."""
    rank, size = hvd.rank(), hvd.size()
    evens = hvd.add_process_set(list(range(0, size, 2)))
    inside = int(hvd.process_set_included_op(evens.process_set_id))
    assert inside == (rank % 2 == 0), (rank, inside)
    if inside:
        members = evens.ranks
        for mode, fn in modes(lambda t: (hvd.allreduce(t, op=hvd.Sum, process_set=evens),
                                         hvd.allgather(tf.reshape(t, [1]), process_set=evens),
                                         hvd.broadcast(t, root_rank=members[-1], process_set=evens),
                                         hvd.size_op(process_set_id=evens.process_set_id),
                                         hvd.rank_op(process_set_id=evens.process_set_id))):
            ar, ag, bc, n, me = fn(tf.constant(float(rank)))
            assert float(ar) == sum(members) and ag.numpy().tolist() == [float(r) for r in members], (mode, ar, ag)
            assert float(bc) == members[-1] and int(n) == len(members) and int(me) == evens.rank(), (mode, bc, n, me)
    hvd.remove_process_set(evens)


def case_errors(hvd):
    """Ranks that disagree on a shape: FailedPreconditionError on every rank naming it, and the
    runtime goes on; an element type the runtime lacks: refused by the op's type list."""
    rank, size = hvd.rank(), hvd.size()
    for mode, fn in modes(lambda t: hvd.allreduce(t, op=hvd.Sum)):
        try:
            fn(tf.ones([rank + 1]))
        except tf.errors.FailedPreconditionError as e:
            assert "shape" in str(e), e
        else:
            raise AssertionError(f"{mode}: a shape mismatch did not fail")
        assert np.allclose(fn(tf.ones([2])).numpy(), size), mode
    try:
        hvd.allreduce(tf.constant([1], tf.uint16))
    except (TypeError, tf.errors.InvalidArgumentError) as e:
        assert "uint16" in str(e), e
    else:
        raise AssertionError("uint16 was accepted")


def case_before_init(hvd):
    """Before hvd.init(): Python calls raise ValueError (those that consult the layout, as
    Horovod's), the ops fail with FailedPreconditionError; each names init."""
    for call in (hvd.size, hvd.rank, lambda: hvd.allreduce(tf.ones(2)), lambda: hvd.allgather(tf.ones(2)),
                 lambda: hvd.broadcast(tf.ones(2), 0)):
        try:
            call()
        except (ValueError, tf.errors.FailedPreconditionError) as e:
            assert "init" in str(e), e
        else:
            raise AssertionError(f"{call} did not raise before init")
    from appliance.tensorflow import mpi_ops
    try:
        mpi_ops.size_op()
    except tf.errors.FailedPreconditionError as e:
        assert "hvd.init()" in str(e), e
    else:
        raise AssertionError("size_op ran before init")
    return {"before_init": True}


CASES = {name[5:]: fn for name, fn in dict(globals()).items() if name.startswith("case_")}
