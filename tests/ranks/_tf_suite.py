"""Cases for tf_hvd.py: what Horovod's own TensorFlow test files found missing or wrong, each in a
few checks: uint16 through the byte-moving ops; grouped allgather and grouped reducescatter (values
with per-rank first dimensions, scaling, their gradients, a scalar member refused on every rank);
and in a tf.compat.v1 graph run by a session: broadcast_ of reference and resource variables,
broadcast_object, broadcast_object_fn and allgather_object; horovod.tensorflow.util and
horovod.runner.common.util.env by Horovod's module paths (the shim on sys.path); an op on a
process set this rank is not in fails as Horovod's (InvalidArgumentError when it runs), and one of
every rank is refused as a duplicate of the global set; Horovod's model-parallel step (alltoall in the
model, a tape with a local source, in a tf.function) after all of these."""
import numpy as np
import tensorflow as tf


def _rows(r):
    return r + 1  # rank r has r + 1 rows: the first dimensions differ


def uint16(hvd):
    r, n = hvd.rank(), hvd.size()
    x = tf.constant(np.full([2, 3], 60000 + r, np.uint16))
    got = hvd.allgather(x).numpy()
    assert got.dtype == np.uint16 and got.tolist() == [[60000 + i] * 3 for i in range(n) for _ in range(2)], got
    got = hvd.broadcast(x, n - 1).numpy()
    assert (got == 60000 + n - 1).all(), got
    got = hvd.alltoall(tf.constant(np.full([n], 65535 - r, np.uint16))).numpy()
    assert got.tolist() == [65535 - i for i in range(n)], got


def grouped(hvd):
    r, n = hvd.rank(), hvd.size()
    a = tf.constant(np.full([_rows(r), 2], r, np.float64))
    b = tf.constant(np.full([_rows(r)], 10 * r, np.float64))
    want_a = np.concatenate([np.full([_rows(i), 2], i) for i in range(n)])
    want_b = np.concatenate([np.full([_rows(i)], 10 * i) for i in range(n)])
    for fn in (hvd.grouped_allgather, tf.function(hvd.grouped_allgather)):
        got = fn([a, b])
        assert np.array_equal(got[0].numpy(), want_a) and np.array_equal(got[1].numpy(), want_b), got
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([a, b])
        ga, gb = hvd.grouped_allgather([a, b])
        loss = tf.reduce_sum(ga * 2.0) + tf.reduce_sum(gb * 3.0)
    da, db = tape.gradient(loss, [a, b])
    assert da.shape == a.shape and np.allclose(da.numpy(), 2.0) and np.allclose(db.numpy(), 3.0), (da, db)

    rows = 2 * n + 1  # uneven: the first rank takes one row more
    x = tf.constant(np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) * (r + 1))
    y = tf.constant(np.arange(rows, dtype=np.float32) * (r + 1))
    tot = sum(i + 1 for i in range(n))
    start = sum(rows // n + (1 if i < rows % n else 0) for i in range(r))
    mine = rows // n + (1 if r < rows % n else 0)
    sx = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)[start:start + mine]
    sy = np.arange(rows, dtype=np.float32)[start:start + mine]
    for op, scale in ((hvd.Sum, tot * 0.5 * 3.0), (hvd.Average, tot / n * 0.5 * 3.0)):
        gx, gy = hvd.grouped_reducescatter([x, y], op=op, prescale_factor=0.5, postscale_factor=3.0)
        assert np.allclose(gx.numpy(), sx * scale) and np.allclose(gy.numpy(), sy * scale), (op, gx, gy)
    with tf.GradientTape() as tape:
        tape.watch([x, y])
        gx, gy = hvd.grouped_reducescatter([x, y], op=hvd.Sum)
        loss = tf.reduce_sum(gx) + tf.reduce_sum(gy)
    dx, dy = tape.gradient(loss, [x, y])
    assert dx.shape == x.shape and np.allclose(dx.numpy(), n) and np.allclose(dy.numpy(), n), (dx, dy)
    try:
        hvd.grouped_reducescatter([x, tf.constant(1.0)])
    except (tf.errors.InvalidArgumentError, ValueError):
        pass
    else:
        raise AssertionError("a scalar member of grouped_reducescatter was not refused")


def graph_helpers(hvd):
    r, n = hvd.rank(), hvd.size()
    from tensorflow.python.ops import resource_variable_ops
    from tensorflow.python.ops.ref_variable import RefVariable

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        ref = RefVariable(tf.fill([3], float(r)))
        res = resource_variable_ops.ResourceVariable(tf.fill([2, 2], r))
        flag = RefVariable(tf.constant([r % 2 == 1, True]))
        sess.run(tf.compat.v1.global_variables_initializer())
        (got_ref,) = hvd.broadcast_([ref], n - 1)
        got_res, = hvd.broadcast_([res], 0)
        got_flag, = hvd.broadcast_([flag], 1)
        assert got_ref.dtype == tf.float32 and got_res.dtype == tf.int32 and got_flag.dtype == tf.bool
        v1, v2, v3 = sess.run([got_ref, got_res, got_flag])
        assert (v1 == n - 1).all() and (sess.run(ref) == n - 1).all(), (v1, sess.run(ref))
        assert (v2 == 0).all() and (sess.run(res) == 0).all(), v2
        assert v3.tolist() == [True, True], v3
        obj = hvd.broadcast_object({"a": [1, 2], "r": r} if r == 0 else None, root_rank=0)
        assert obj == {"a": [1, 2], "r": 0}, obj
        assert hvd.allgather_object({"r": r, "x": "y" * r}) == [{"r": i, "x": "y" * i} for i in range(n)]
        fn = hvd.broadcast_object_fn(root_rank=n - 1)
        for k in range(2):
            got = fn(("from", r, k))
            assert got == ("from", n - 1, k), got
    try:
        with tf.Graph().as_default():
            hvd.broadcast_object(1)
    except ValueError as e:
        assert "session" in str(e), e
    else:
        raise AssertionError("broadcast_object in a graph without a session did not raise")


def module_paths(hvd):
    import horovod.tensorflow as htf
    from horovod.runner.common.util.env import get_env_rank_and_size
    from horovod.tensorflow.util import _executing_eagerly

    assert htf is hvd and htf.util._executing_eagerly is _executing_eagerly is hvd._executing_eagerly
    assert _executing_eagerly() and get_env_rank_and_size() == (hvd.rank(), hvd.size())


def process_set_errors(hvd):
    """An op on a registered set this rank is not in fails when it runs (InvalidArgumentError);
    an unregistered set is a ValueError; the ids and ranks, and the repr, as Horovod's."""
    r, n = hvd.rank(), hvd.size()
    try:  # every rank duplicates the global set: refused, as Horovod's test_horovod_add_get_remove_process_set
        hvd.add_process_set(range(n))
    except ValueError as e:
        assert "the global process set" in str(e), e
    else:
        raise AssertionError("a set of every rank was added beside the global set")
    first = hvd.add_process_set([0])
    assert hvd.mpi_ops._basics._get_process_set_ids_and_ranks() == {0: list(range(n)), first.process_set_id: [0]}
    assert str(first) == f"ProcessSet(process_set_id={first.process_set_id}, ranks=[0], mpi_comm=None)", str(first)
    try:
        got = hvd.allreduce(tf.ones([2]), op=hvd.Sum, process_set=first)
    except tf.errors.InvalidArgumentError as e:
        assert r != 0 and "not in process set" in str(e), (r, e)
    else:
        assert r == 0 and got.numpy().tolist() == [1.0, 1.0], (r, got)
    fake = hvd.ProcessSet([0])
    fake.process_set_id = 10
    try:
        hvd.allreduce(tf.ones([2]), process_set=fake)
    except ValueError:
        pass
    else:
        raise AssertionError("an unregistered process set was accepted")
    # A rank outside the set keeps its own gradients through the tape (Horovod's tests on non-members)
    v = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * float(r + 1))
    grad = hvd.DistributedGradientTape(tape, process_set=first).gradient(loss, [v])[0]
    assert grad.numpy().tolist() == [float(r + 1)] * 2, (r, grad)
    hvd.remove_process_set(first)


def model_parallel(hvd):
    """Horovod's test_model_parallel_model after the cases above (it is run after the file's other
    tests): alltoall inside the model, a tape with a local source, all in a tf.function."""
    r, n = hvd.rank(), hvd.size()
    emb = tf.Variable(tf.fill([n, 3], float(r + 1)))
    dense = tf.Variable(tf.ones([3 * n, 1]))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            y = hvd.alltoall(tf.identity(emb))  # row i from rank i
            loss = tf.reduce_sum(tf.matmul(tf.reshape(y, [1, 3 * n]), dense))
        tape = hvd.DistributedGradientTape(tape)
        tape.register_local_source(emb)
        return tape.gradient(loss, [emb, dense])

    g_emb, g_dense = step()
    # every rank receives rows 1, 2, ..., n: dense's gradient is those (the same on every rank, so
    # their average); emb's comes back through alltoall's gradient, local, scaled by 1/n
    assert np.allclose(g_dense.numpy()[:, 0], np.repeat(np.arange(1.0, n + 1), 3)), (r, g_dense)
    assert np.allclose(g_emb.numpy(), np.ones([n, 3]) / n), (r, g_emb)


def horovod_suite(hvd):
    for case in (uint16, grouped, graph_helpers, module_paths, process_set_errors, model_parallel):
        case(hvd)


CASES = {"horovod_suite": horovod_suite}
