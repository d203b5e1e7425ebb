"""Cases for tf_hvd.py: one training step eagerly, inside tf.function and in a tf.compat.v1
session (DistributedOptimizer) gives the numbers of one process on the whole batch; a step's
gradients negotiate in one round and fuse (the core's counters)."""
import os
import signal
import time

import numpy as np
import tensorflow as tf

from appliance.runtime import engine

LR, STEPS, ROWS, FEATURES = 0.1, 3, 8, 5


def batch(rank):
    g = np.random.RandomState(100 + rank)
    return g.randn(ROWS, FEATURES).astype(np.float32), g.randn(ROWS, 1).astype(np.float32)


def init_params():
    g = np.random.RandomState(7)
    return g.randn(FEATURES, 1).astype(np.float32), np.zeros(1, np.float32)


def reference(size):
    """Plain gradient descent on every rank's rows at once (numpy)."""
    w, b = (p.astype(np.float64) for p in init_params())
    xs = np.concatenate([batch(r)[0] for r in range(size)]).astype(np.float64)
    ys = np.concatenate([batch(r)[1] for r in range(size)]).astype(np.float64)
    for _ in range(STEPS):
        err = xs @ w + b - ys  # d/dpred of mean((pred - y)^2) over each rank's rows, then averaged
        gw = 2 * xs.T @ err / len(xs)
        gb = 2 * err.sum(0) / len(xs)
        w, b = w - LR * gw, b - LR * gb
    return w, b


def tf2_step(hvd, w, b, x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(x, w) + b - y) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    gw, gb = tape.gradient(loss, [w, b])
    w.assign_sub(LR * gw)
    b.assign_sub(LR * gb)


def case_training(hvd):
    rank, size = hvd.rank(), hvd.size()
    want_w, want_b = reference(size)
    x, y = (tf.constant(a) for a in batch(rank))
    results = {}
    for mode in ("eager", "function"):
        w0, b0 = init_params()
        w, b = tf.Variable(w0 + rank), tf.Variable(b0 - rank)  # differ per rank until broadcast
        hvd.broadcast_variables([w, b], root_rank=0)
        step = (lambda: tf2_step(hvd, w, b, x, y)) if mode == "eager" else tf.function(lambda: tf2_step(hvd, w, b, x, y))
        for _ in range(STEPS):
            step()
        results[mode] = (w.numpy(), b.numpy())
    with tf.Graph().as_default():
        w0, b0 = init_params()
        w = tf.compat.v1.get_variable("w", initializer=w0 + rank)
        b = tf.compat.v1.get_variable("b", initializer=b0 - rank)
        loss = tf.reduce_mean((tf.matmul(tf.constant(batch(rank)[0]), w) + b - tf.constant(batch(rank)[1])) ** 2)
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR))
        train = opt.minimize(loss)
        hooks = [hvd.BroadcastGlobalVariablesHook(0)]
        with tf.compat.v1.train.MonitoredSession(hooks=hooks) as sess:
            for _ in range(STEPS):
                sess.run(train)
            results["session"] = tuple(sess.run([w, b]))
    for mode, (w, b) in results.items():
        assert np.allclose(w, want_w, atol=1e-5) and np.allclose(b, want_b, atol=1e-5), (mode, w.ravel(), want_w.ravel())
    return {"max_abs_error": max(float(np.abs(w - want_w).max()) for w, _ in results.values())}


def case_fusion(hvd):
    """A step of 12 small gradients: after a warm-up step, the next step's allreduces are in
    flight together, so the runtime plans them in one round and fuses them."""
    variables = [tf.Variable(tf.ones([10 + i])) for i in range(12)]

    def grads():
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(v * float(i)) for i, v in enumerate(variables)])
        return hvd.DistributedGradientTape(tape).gradient(loss, variables)

    grads()  # traces the averaging function; names enter the response cache
    stats = engine.current().core.stats
    rounds = []
    for _ in range(3):
        before = dict(stats())
        out = grads()
        after = dict(stats())
        rounds.append({k: after[k] - before[k] for k in ("plans", "entries", "tensors", "fused_entries")})
    for i, g in enumerate(out):
        assert np.allclose(g.numpy(), float(i)), (i, g.numpy()[:3])
    return {"fusion_rounds": rounds}


def case_killed(hvd):
    """The last rank dies (SIGKILL) after a first allreduce; every other rank's next allreduce
    fails with UnknownError naming it, within the bound the test sets."""
    rank, size = hvd.rank(), hvd.size()
    hvd.allreduce(tf.ones([2]), op=hvd.Sum)
    if rank == size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        hvd.allreduce(tf.ones([2]), op=hvd.Sum)
    except tf.errors.UnknownError as e:
        return {"error": str(e), "seconds": time.monotonic() - t0}
    raise AssertionError("an allreduce with a dead rank did not fail")


CASES = {name[5:]: fn for name, fn in dict(globals()).items() if name.startswith("case_")}
