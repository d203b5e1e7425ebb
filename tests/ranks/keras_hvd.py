"""Worker for tests/keras: ``horovod.tensorflow.keras`` on real ranks, with whichever Keras
``tf.keras`` is (Keras 3, or tf-keras under ``TF_USE_LEGACY_KERAS=1``).

Usage: keras_hvd.py. Every rank has its own rows (seeded by rank) and its own initial weights
(seeded by rank: the broadcast callback must make them root's). Cases, in one process:
``fit``: ``model.fit`` with ``DistributedOptimizer``, the broadcast, metric-average and
checkpoint callbacks; the weights, and a one-process fit on every rank's rows of each step
(computed here, without Horovod) for the test to compare; ``lr``: the learning rate the
warmup and schedule callbacks set at each batch; ``apply``: gradients handed to the optimizer
(Keras 3: ``apply_gradients`` and ``apply``; tf-keras: ``minimize``), eagerly and in
``tf.function``, are averaged; with fp16 compression, an embedding's sparse gradient and
``backward_passes_per_step=2``; ``fusion``: a step's gradients reach the runtime together (one plan); ``load``: ``load_model`` on rank
0's checkpoint gives a wrapped optimizer with the saved iteration count, and one more epoch keeps
the ranks equal; ``sync_bn``: ``SyncBatchNormalization`` in a masked model trained one step on
batches of different sizes holds the concatenated batch's moving statistics. Reports JSON through ``_report``; a failed check raises (non-zero exit).
"""
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from _report import report  # noqa: E402

import horovod.tensorflow.keras as hvd  # noqa: E402

keras = tf.keras
ROWS, BATCH, FEATURES, EPOCHS, LR = 12, 4, 5, 2, 0.05
LEGACY = keras.__name__.startswith("tf_keras")


def data(rank):
    g = np.random.RandomState(100 + rank)
    return g.randn(ROWS, FEATURES).astype(np.float32), g.randn(ROWS, 1).astype(np.float32)


def model_for(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(1)])


class Record(keras.callbacks.Callback):
    """The learning rate at each batch's start; the epoch's logs as this rank saw them."""

    def __init__(self):
        super().__init__()
        self.lrs, self.logs = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(np.asarray(keras.backend.get_value(self.model.optimizer.learning_rate))))

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs or {}))


def flat(model):
    return np.concatenate([np.ravel(w) for w in model.get_weights()]).tolist()


def case_fit(out, rank, size):
    x, y = data(rank)
    model = model_for(1 + rank)  # ranks differ until the broadcast
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9)))
    raw = Record()
    ext = ".h5" if LEGACY else ".keras"
    ckpt = os.path.join(out, f"r{rank}", "best" + ext)
    os.makedirs(os.path.dirname(ckpt), exist_ok=True)
    cbs = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), raw, hvd.callbacks.MetricAverageCallback(),
           hvd.callbacks.BestModelCheckpoint(monitor="loss", filepath=ckpt)]
    hist = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=cbs)
    # one process, every rank's rows of a step in one batch, from root's initial weights
    ref = model_for(1)
    ref.compile(loss="mse", optimizer=keras.optimizers.SGD(LR, momentum=0.9))
    parts = [data(r) for r in range(size)]
    steps = ROWS // BATCH
    xs = np.concatenate([p[0][s * BATCH:(s + 1) * BATCH] for s in range(steps) for p in parts])
    ys = np.concatenate([p[1][s * BATCH:(s + 1) * BATCH] for s in range(steps) for p in parts])
    ref.fit(xs, ys, batch_size=BATCH * size, epochs=EPOCHS, shuffle=False, verbose=0)
    hvd.allreduce(0.0, name="barrier_after_fit")  # rank 0's checkpoint is written
    return model, {"weights": flat(model), "reference": flat(ref), "history_loss": hist.history["loss"],
                   "raw_loss": [lg["loss"] for lg in raw.logs], "checkpoint_written": os.path.exists(ckpt),
                   "iterations": int(model.optimizer.iterations.numpy())}


def case_lr(size):
    x, y = data(0)
    model = model_for(1)
    init = 0.1 * size
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(init, momentum=0.9)))
    rec = Record()
    cbs = [hvd.callbacks.LearningRateWarmupCallback(initial_lr=init, warmup_epochs=2),
           hvd.callbacks.LearningRateScheduleCallback(initial_lr=init, multiplier=0.5, start_epoch=2, end_epoch=4),
           hvd.callbacks.LearningRateScheduleCallback(initial_lr=init, multiplier=lambda e: 0.01 * e,
                                                      start_epoch=4, end_epoch=5), rec]
    model.fit(x, y, batch_size=BATCH, epochs=5, shuffle=False, verbose=0, callbacks=cbs)
    # momentum correction for a batch where the rate halves: Keras 3 scales the velocities by
    # new/old (its step holds momentum as a constant); tf-keras sets momentum * new/old for the
    # batch and restores it, as Horovod
    opt = model.optimizer
    velocities = [np.array(v.numpy()) for v in opt.momentums]
    cb = hvd.callbacks.LearningRateScheduleCallback(initial_lr=init * 0.01 * 4, multiplier=0.5, start_epoch=0)
    cb.set_model(model)
    cb.on_train_begin()
    cb.on_epoch_begin(1)
    cb.on_batch_begin(0)
    if LEGACY:
        corrected = np.isclose(opt.momentum, 0.9 * 0.5)
        cb.on_batch_end(0)
        corrected = corrected and np.isclose(opt.momentum, 0.9)
    else:
        corrected = all(np.allclose(v.numpy(), 0.5 * b) for v, b in zip(opt.momentums, velocities))
    corrected = bool(corrected and any(np.abs(b).sum() > 0 for b in velocities))
    return {"lrs": rec.lrs, "steps_per_epoch": ROWS // BATCH, "initial_lr": init, "momentum_corrected": corrected}


def hand(opt, loss_fn, variables, method="apply_gradients"):
    """One step: Keras 3 takes the gradients through ``apply_gradients`` or ``apply`` (where its
    ``train_step`` hands them); tf-keras through ``minimize`` (its ``train_step``'s way, where
    Horovod averages)."""
    with tf.GradientTape() as tape:
        loss = loss_fn()
    if LEGACY:
        return opt.minimize(loss, variables, tape=tape)
    grads = tape.gradient(loss, variables)
    if method == "apply":
        return opt.apply(grads, variables)
    return opt.apply_gradients(zip(grads, variables))


def case_apply(rank, size):
    """Gradients handed to the optimizer are averaged: rank r's gradient is r + 1."""
    mean = sum(range(1, size + 1)) / size
    got = {}
    for mode in ("eager", "function"):
        for method in ("apply_gradients",) + (() if LEGACY else ("apply",)):
            v = tf.Variable([0.0, 0.0])
            opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), compression=hvd.Compression.fp16)

            def step():
                hand(opt, lambda: tf.reduce_sum(v * tf.constant([1.0, 2.0]) * float(rank + 1)), [v], method)

            (tf.function(step) if mode == "function" else step)()
            got[f"{mode}/{method}"] = v.numpy().tolist()
            assert np.allclose(v.numpy(), [-mean, -2 * mean]), (mode, method, v.numpy())
    # an embedding's sparse gradient (IndexedSlices: allgathered) and the same as dense
    for sparse_as_dense in (False, True):
        table = tf.Variable(tf.zeros([4, 2]))
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), sparse_as_dense=sparse_as_dense)
        tf.function(lambda: hand(opt, lambda: tf.reduce_sum(tf.gather(table, [rank % 4]) * float(rank + 1)),
                                 [table]))()
        want = np.zeros([4, 2])
        for r in range(size):
            want[r % 4] -= (r + 1) / size
        assert np.allclose(table.numpy(), want), (sparse_as_dense, table.numpy(), want)
    # backward_passes_per_step=2: the first pass only counts; the second applies the sum, averaged
    v = tf.Variable([0.0])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2)
    step = tf.function(lambda: hand(opt, lambda: tf.reduce_sum(v) * float(rank + 1), [v]))
    step()
    first = (float(v.numpy()[0]), int(opt.iterations.numpy()))
    step()
    assert first == (0.0, 1), first
    assert np.allclose(v.numpy(), [-2 * mean]) and int(opt.iterations.numpy()) == 2, (v.numpy(), opt.iterations)
    return {"apply": got}


def case_fusion():
    """After a warm-up, each ``train_on_batch`` of a 3-layer model hands its 6 gradients to the
    runtime together: one plan per step (the core's counters)."""
    from appliance.runtime import engine

    model = model_for(3)
    model.add(keras.layers.Dense(2))
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)))
    x, y = data(0)
    y = np.concatenate([y, y], axis=1)
    model.train_on_batch(x, y)
    stats = engine.current().core.stats
    rounds = []
    for _ in range(3):
        before = dict(stats())
        model.train_on_batch(x, y)
        after = dict(stats())
        rounds.append({k: after[k] - before[k] for k in ("plans", "entries", "tensors", "fused_entries")})
    xla = None
    if not LEGACY:  # Keras 3 compiles with XLA by default where a GPU is visible: one clear error
        model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), jit_compile=True)
        try:
            model.train_on_batch(x, y)
        except ValueError as e:
            xla = str(e)
    return {"fusion_rounds": rounds, "fusion_gradients": len(model.trainable_variables), "xla_error": xla}


def sync_bn_data(rank):
    """Rank r: 2 + r sequences of 4 steps of 3 features, the last r % 3 steps of each padded
    (zeros: masked), so the ranks' batches and their unmasked counts differ."""
    g = np.random.RandomState(70 + rank)
    x = (g.randn(2 + rank, 4, 3) * (1 + rank) + rank).astype(np.float32)
    x[:, 4 - rank % 3:, :] = 0.0
    return x, g.randn(2 + rank, 1).astype(np.float32)


def sync_bn_model(layer):
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((4, 3)), keras.layers.Masking(0.0), keras.layers.Dense(3),
                             layer(momentum=0.5), keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])


def case_sync_bn(rank, size):
    """``hvd.SyncBatchNormalization`` (``horovod.tensorflow``'s) after a masked Dense, one ``fit``
    step on each rank's own batch: its moving mean and variance are those of one process's
    ``BatchNormalization`` on the concatenated batch through the same Dense (masks and sizes
    counted), called eagerly (a second ``fit`` would trace a second step)."""
    import horovod.tensorflow as hvd_tf

    x, y = sync_bn_data(rank)
    model = sync_bn_model(hvd_tf.SyncBatchNormalization)
    dense = [np.array(w) for w in model.layers[1].get_weights()]  # the same on every rank (seeded)
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)))
    model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    xs = np.concatenate([sync_bn_data(r)[0] for r in range(size)])
    ref = keras.layers.BatchNormalization(momentum=0.5)
    ref(tf.constant(xs @ dense[0] + dense[1]), training=True, mask=tf.constant(np.any(xs != 0.0, axis=-1)))
    got = model.layers[2]
    return {"sync_bn": {"moving": [got.moving_mean.numpy().tolist(), got.moving_variance.numpy().tolist()],
                        "reference": [ref.moving_mean.numpy().tolist(), ref.moving_variance.numpy().tolist()],
                        "weights": flat(model)}}


def case_load(out, rank, size, trained):
    ext = ".h5" if LEGACY else ".keras"
    model = hvd.load_model(os.path.join(out, "r0", "best" + ext))
    opt = model.optimizer
    assert hasattr(opt, "register_local_var"), f"load_model gave an unwrapped {type(opt)}"
    assert type(opt).__name__ == "SGD", type(opt)
    iterations = int(opt.iterations.numpy())
    x, y = data(rank)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return {"loaded_iterations": iterations, "loaded_weights": flat(model),
            "trained_iterations": trained}


def main():
    out = os.environ["APPLIANCE_TEST_OUT"]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    data_ = {"ok": False, "rank": rank, "size": size, "legacy": LEGACY}
    try:
        t = time.monotonic()
        seconds = data_["seconds"] = {}

        def timed(name, result):
            nonlocal t
            seconds[name], t = round(time.monotonic() - t, 2), time.monotonic()
            data_.update(result)

        _, fit = case_fit(out, rank, size)
        timed("fit", fit)
        timed("lr", case_lr(size))
        timed("apply", case_apply(rank, size))
        timed("fusion", case_fusion())
        timed("load", case_load(out, rank, size, fit["iterations"]))
        timed("sync_bn", case_sync_bn(rank, size))
        data_["ok"] = True
    finally:
        report(data_)
        hvd.shutdown()


if __name__ == "__main__":
    main()
