"""Worker for tests/keras/test_keras_torch_backend.py: ``import horovod.keras as hvd`` with Keras 3
on ``KERAS_BACKEND=torch`` (set by the test).

Every rank has its own rows and its own initial weights (both seeded by rank); ``fit`` with
``DistributedOptimizer(SGD(momentum))``, ``BroadcastGlobalVariablesCallback(0)`` and
``MetricAverageCallback``, 2 epochs of 3 steps. Reports the backend, the weights, a one-process
``fit`` (no Horovod) on every rank's rows of each step from root's initial weights, the History's
losses and this rank's own (a callback before the average), and the error of a
``DistributedOptimizer`` with fp16 compression (refused by name on this backend), and of one made
while Keras says its backend is jax (refused by name: no path averages jax gradients).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from _report import report  # noqa: E402

import horovod.keras as hvd  # noqa: E402

ROWS, BATCH, EPOCHS = 12, 4, 2


def data(rank):
    g = np.random.RandomState(200 + rank)
    return g.randn(ROWS, 5).astype(np.float32), g.randn(ROWS, 1).astype(np.float32)


def model_for(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])


def flat(model):
    return np.concatenate([np.ravel(w) for w in model.get_weights()]).tolist()


class Raw(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_epoch_end(self, epoch, logs=None):
        self.losses.append(float(logs["loss"]))


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    rep = {"ok": False, "rank": rank, "backend": keras.backend.backend()}
    try:
        x, y = data(rank)
        model = model_for(1 + rank)
        model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)))
        raw = Raw()
        hist = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                         callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), raw,
                                    hvd.callbacks.MetricAverageCallback()])
        ref = model_for(1)
        ref.compile(loss="mse", optimizer=keras.optimizers.SGD(0.05, momentum=0.9))
        parts = [data(r) for r in range(size)]
        steps = ROWS // BATCH
        xs = np.concatenate([p[0][s * BATCH:(s + 1) * BATCH] for s in range(steps) for p in parts])
        ys = np.concatenate([p[1][s * BATCH:(s + 1) * BATCH] for s in range(steps) for p in parts])
        ref.fit(xs, ys, batch_size=BATCH * size, epochs=EPOCHS, shuffle=False, verbose=0)
        rep.update(weights=flat(model), reference=flat(ref), history_loss=hist.history["loss"], raw_loss=raw.losses)
        fp16 = model_for(3)
        fp16.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                                                    compression=hvd.Compression.fp16))
        try:
            fp16.train_on_batch(x, y)
            rep["fp16_error"] = None
        except NotImplementedError as e:
            rep["fp16_error"] = str(e)
        real, keras.backend.backend = keras.backend.backend, lambda: "jax"  # as KERAS_BACKEND=jax says
        try:
            hvd.DistributedOptimizer(keras.optimizers.SGD(0.05))
            rep["jax_error"] = None
        except NotImplementedError as e:
            rep["jax_error"] = str(e)
        finally:
            keras.backend.backend = real
        rep["ok"] = True
    finally:
        report(rep)
        hvd.shutdown()


if __name__ == "__main__":
    main()
