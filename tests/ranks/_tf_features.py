"""Cases for tf_hvd.py: the training features beyond plain averaging, each against a one-process
reference that every rank computes for all ranks (inputs are reproducible from the rank):
local gradient aggregation (``backward_passes_per_step``: the v1 ``DistributedOptimizer`` in a
session, the eager helper eagerly and in ``tf.function``), ``PartialDistributedGradientTape``
(local layers), ``SyncBatchNormalization`` (the concatenated batch's numbers) and Adasum through
the tape and the v1 optimizer (the recursive pairwise Adasum of the ranks' tensors)."""
import time

import numpy as np
import tensorflow as tf

LR, ROWS, FEATURES = 0.1, 6, 4


def data(rank, k):
    """Rank ``rank``'s batch of pass ``k``."""
    g = np.random.RandomState(1000 + 17 * rank + k)
    return g.randn(ROWS, FEATURES).astype(np.float32), g.randn(ROWS, 1).astype(np.float32)


def w_init():
    return np.random.RandomState(3).randn(FEATURES, 1).astype(np.float32)


def lin_grad(w, x, y):
    """d mean((xw - y)^2) / dw, in float64."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    return 2 * x.T @ (x @ w - y) / len(x)


def close(got, want, what, tol=1e-5):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape and np.allclose(got, want, rtol=tol, atol=tol), (what, got.ravel()[:6],
                                                                                     want.ravel()[:6])


def same_on_all_ranks(hvd, value, what):
    gathered = hvd.allgather(tf.reshape(tf.constant(value, tf.float32), [1, -1])).numpy()
    assert np.allclose(gathered, gathered[0:1], atol=1e-6), (what, gathered)
    return gathered


def aggregated_reference(size, passes, runs, average):
    """w after ``runs`` runs, applying every ``passes``-th run the ranks' mean gradient summed
    over the passes (divided by ``passes`` when ``average``)."""
    w = w_init().astype(np.float64)
    acc = 0
    for k in range(runs):
        acc = acc + np.mean([lin_grad(w, *data(r, k)) for r in range(size)], axis=0)
        if (k + 1) % passes == 0:
            w = w - LR * acc / (passes if average else 1)
            acc = 0
    return w


def check_aggregation(hvd, rank, size):
    passes, runs = 2, 5  # two applied updates and a pending pass
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=w_init() + rank)  # differs until the hook's broadcast
        x, y = tf.compat.v1.placeholder(tf.float32, [ROWS, FEATURES]), tf.compat.v1.placeholder(tf.float32, [ROWS, 1])
        loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR), backward_passes_per_step=passes,
                                       average_aggregated_gradients=True)
        step = tf.compat.v1.train.get_or_create_global_step()
        train = opt.minimize(loss, global_step=step)
        with tf.compat.v1.train.MonitoredSession(hooks=[hvd.BroadcastGlobalVariablesHook(0)]) as sess:
            for k in range(runs):
                xs, ys = data(rank, k)
                sess.run(train, {x: xs, y: ys})
            got, steps = sess.run([w, step])
    close(got, aggregated_reference(size, passes, runs, average=True), "v1 session, backward_passes_per_step=2")
    assert steps == runs, ("global_step counts every run", steps)
    try:
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR), backward_passes_per_step=2)
    except ValueError as e:
        assert "eager" in str(e), e
    else:
        raise AssertionError("a v1 DistributedOptimizer with backward_passes_per_step > 1 ran eagerly")

    from appliance.tensorflow.gradient_aggregation_eager import LocalGradientAggregationHelperEager

    for mode in ("eager", "function"):
        w = tf.Variable(w_init())
        helper = LocalGradientAggregationHelperEager(passes, lambda gs, vs: [hvd.allreduce(g) for g in gs],
                                                     sparse_as_dense=False, average_aggregated_gradients=False)

        def one_pass(xs, ys):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((tf.matmul(xs, w) - ys) ** 2)
            grads = helper.compute_gradients(tape.gradient(loss, [w]), [w])
            helper.apply_gradients(lambda: w.assign_sub(LR * grads[0]), None, list(zip(grads, [w])))

        run = one_pass if mode == "eager" else tf.function(one_pass)
        for k in range(runs):
            run(*(tf.constant(a) for a in data(rank, k)))
        close(w.numpy(), aggregated_reference(size, passes, runs, average=False), f"eager helper, {mode}")
        assert int(helper.counter.numpy()) == runs % passes, helper.counter.numpy()


def two_layer_params(rank):
    g = np.random.RandomState(5)
    w1, b1 = g.randn(FEATURES, 3).astype(np.float32), g.randn(3).astype(np.float32)
    w2, b2 = g.randn(3, 1).astype(np.float32), g.randn(1).astype(np.float32)
    return [w1 + 0.1 * rank, b1 - 0.1 * rank, w2, b2]  # the first layer differs per rank


def two_layer_loss(params, x, y):
    w1, b1, w2, b2 = params
    return tf.reduce_mean((tf.matmul(tf.matmul(x, w1) + b1, w2) + b2 - y) ** 2)


def partial_reference(size, rank, steps):
    """Every rank's two-layer model stepped in one process: layer 2 with the ranks' mean
    gradient, layer 1 with the rank's own gradient / size; rank ``rank``'s parameters."""
    models = [[tf.Variable(p, dtype=tf.float64) for p in two_layer_params(r)] for r in range(size)]
    for k in range(steps):
        grads = []
        for r in range(size):
            x, y = (tf.constant(a, tf.float64) for a in data(r, k))
            with tf.GradientTape() as tape:
                loss = two_layer_loss(models[r], x, y)
            grads.append(tape.gradient(loss, models[r]))
        for r in range(size):
            for i in range(4):
                g = grads[r][i] / size if i < 2 else tf.add_n([grads[q][i] for q in range(size)]) / size
                models[r][i].assign_sub(LR * g)
    return [v.numpy() for v in models[rank]]


def check_partial_tape(hvd, rank, size):
    steps = 2
    want = partial_reference(size, rank, steps)
    for mode in ("eager", "function"):
        layers = [tf.keras.layers.Dense(3), tf.keras.layers.Dense(1)]
        model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), *layers])
        for v, p in zip(model.trainable_weights, two_layer_params(rank)):
            v.assign(p)

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            tape = hvd.PartialDistributedGradientTape(tape, local_layers=layers[0])
            local, reduced = tape.get_local_and_global_gradients(loss, model.trainable_weights)
            for v, g in local + reduced:
                v.assign_sub(LR * g)
            return len(local), len(reduced)

        run = step if mode == "eager" else tf.function(step)
        for k in range(steps):
            n_local, n_reduced = run(*(tf.constant(a) for a in data(rank, k)))
        assert (int(n_local), int(n_reduced)) == (2, 2), (n_local, n_reduced)
        for i, (v, p) in enumerate(zip(model.trainable_weights, want)):
            close(v.numpy(), p, f"partial tape {mode}, parameter {i}")
        same_on_all_ranks(hvd, model.trainable_weights[2].numpy().ravel(), f"partial tape {mode}: layer 2")
        firsts = hvd.allgather(tf.reshape(model.trainable_weights[0], [1, -1])).numpy()
        assert not np.allclose(firsts[0], firsts[1]), f"partial tape {mode}: the local layer came out equal"
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layers[0](tf.ones([1, FEATURES])))
    try:
        hvd.PartialDistributedGradientTape(tape, local_layers=[object()])
    except ValueError as e:
        assert "tf.keras.layers.Layer" in str(e), e
    else:
        raise AssertionError("PartialDistributedGradientTape took a local layer that is not a Keras layer")


def bn_input(rank):
    g = np.random.RandomState(40 + rank)
    return (g.randn(5, 3) * (1 + rank) + rank).astype(np.float32)


def check_sync_batch_norm(hvd, rank, size):
    xs = [bn_input(r) for r in range(size)]
    cs = [np.random.RandomState(60 + r).randn(5, 3).astype(np.float32) for r in range(size)]
    ref = tf.keras.layers.BatchNormalization(momentum=0.5)
    x_all = tf.constant(np.concatenate(xs))
    with tf.GradientTape() as tape:
        tape.watch(x_all)
        out_all = ref(x_all, training=True)
        loss_all = tf.reduce_sum(out_all * np.concatenate(cs))
    dx_all = tape.gradient(loss_all, x_all).numpy()
    rows = slice(5 * rank, 5 * rank + 5)
    for mode in ("eager", "function"):
        sync = hvd.SyncBatchNormalization(momentum=0.5)

        def forward(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                out = sync(x, training=True)
                loss = tf.reduce_sum(out * cs[rank])
            return out, tape.gradient(loss, x)

        run = forward if mode == "eager" else tf.function(forward)
        out, dx = run(tf.constant(xs[rank]))
        close(out.numpy(), out_all.numpy()[rows], f"SyncBatchNormalization {mode}: output")
        close(dx.numpy(), dx_all[rows], f"SyncBatchNormalization {mode}: input gradient", tol=1e-4)
        close(sync.moving_mean.numpy(), ref.moving_mean.numpy(), f"SyncBatchNormalization {mode}: moving mean")
        close(sync.moving_variance.numpy(), ref.moving_variance.numpy(), f"SyncBatchNormalization {mode}: moving var")
        close(sync(tf.constant(xs[rank]), training=False).numpy(), ref(tf.constant(xs[rank]), training=False).numpy(),
              f"SyncBatchNormalization {mode}: inference")
    try:
        hvd.SyncBatchNormalization(fused=True)
    except ValueError as e:
        assert "fused" in str(e), e
    else:
        raise AssertionError("SyncBatchNormalization(fused=True) was accepted")


def adasum_ref(vectors):
    """Recursive pairwise Adasum (ranks past the largest power of 2 folded in first)."""
    def pair(a, b):
        dot, aa, bb = a @ b, a @ a, b @ b
        return (1 - dot / (2 * aa) if aa > 0 else 1.0) * a + (1 - dot / (2 * bb) if bb > 0 else 1.0) * b

    xs = [np.asarray(v, np.float64).ravel() for v in vectors]
    q = 1 << (len(xs).bit_length() - 1)
    vs = [xs[r] if r + q >= len(xs) else pair(xs[r], xs[r + q]) for r in range(q)]
    while len(vs) > 1:
        vs = [pair(vs[i], vs[i + 1]) for i in range(0, len(vs), 2)]
    return vs[0]


def check_adasum(hvd, rank, size):
    w0 = w_init()
    grads = [[lin_grad(w0.astype(np.float64), *data(r, 9)), np.asarray([r + 1.0, -2.0 * r])] for r in range(size)]
    for groups in (0, 1):  # one allreduce per gradient (fused by the runtime), one grouped allreduce
        w, b = tf.Variable(w0), tf.Variable([0.5, 0.5])
        x, y = (tf.constant(a) for a in data(rank, 9))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2) + tf.reduce_sum(b * [rank + 1.0, -2.0 * rank])
        got = hvd.DistributedGradientTape(tape, op=hvd.Adasum, num_groups=groups).gradient(loss, [w, b])
        for i in range(2):
            close(got[i].numpy().ravel(), adasum_ref([g[i] for g in grads]), f"tape Adasum groups={groups}, grad {i}")
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=w0)
        x, y = (tf.constant(a) for a in data(rank, 9))
        loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR), op=hvd.Adasum)
        train = opt.minimize(loss)
        with tf.compat.v1.train.MonitoredSession() as sess:
            sess.run(train)
            got = sess.run(w)
    want = w0.ravel() + adasum_ref([-LR * g[0] for g in grads])
    close(got.ravel(), want, "v1 DistributedOptimizer(op=Adasum): start + Adasum of the ranks' updates")
    same_on_all_ranks(hvd, got.ravel(), "v1 Adasum optimizer")


def case_features(hvd):
    """Every check runs (a failing one does not hide the others); their failures are reported
    by name, with each check's seconds."""
    rank, size = hvd.rank(), hvd.size()
    failures, seconds = {}, {}
    for name, check in (("aggregation", check_aggregation), ("partial_tape", check_partial_tape),
                        ("sync_batch_norm", check_sync_batch_norm), ("adasum", check_adasum)):
        t0 = time.monotonic()
        try:
            check(hvd, rank, size)
        except AssertionError as e:
            failures[name] = repr(e)[:2000]
        seconds[name] = round(time.monotonic() - t0, 2)
    return {"failures": failures, "seconds": seconds}


CASES = {name[5:]: fn for name, fn in dict(globals()).items() if name.startswith("case_")}
