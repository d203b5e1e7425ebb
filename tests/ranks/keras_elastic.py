"""Rank program for tests/keras/test_keras_elastic.py: Horovod's elastic Keras script under Keras 3
(``import horovod.tensorflow.keras as hvd``, shim/ on PYTHONPATH): ``hvd.elastic.run`` around
``model.fit`` with a ``KerasState`` and the three state callbacks in the order Horovod's example
lists them (commit first), ``epochs=EPOCHS - state.epoch`` and ``steps_per_epoch=STEPS``.

The network, its first weights and the batches are tests/ranks/elastic_tf.py's (``keras_model``,
``batch``, ``replay``): global step g (1-based, ``state.epoch * STEPS + state.batch``) of rank r
trains on ``batch(g, r)``. Each ``fit`` gets the stream from the committed step on, so what a rank
trains is a pure function of the sizes its steps ran at; at the end rank 0 replays it in one
process. A stream that ran past its epochs (an epoch not shortened after a reset) trains batches
the replay does not have.

With ``TF_USE_LEGACY_KERAS=1`` the same network and weights are tf-keras's. Usage: keras_elastic.py
OUT EPOCHS STEPS. ``OUT/kill.W`` (a global step): worker W SIGKILLs itself as that batch begins.
``OUT/grow.W`` (a global step): worker W, while the job has one rank, holds as that batch begins
(after the commit of the one before) and asks for host updates until the launcher's notice of a new
host arrives (``state.check_host_updates`` raises ``HostsUpdatedInterrupt`` out of ``fit``; ``run``
resets and goes on at the new size), for at most 120 s: a fixed-length ``fit`` would otherwise
end before the job grows. Evidence per worker W (APPLIANCE_ELASTIC_WORKER), as tests/fixtures/
elastic_grow.py reads it: ``pid.W``; ``log.W``, one JSON line per finished batch (step, epoch,
batch, size, rank, pid, the sum of the model's variables, HOROVOD_ELASTIC); ``done.W`` (the sizes
per step, the final epoch and batch, variables, the replay's variables, resets).
"""
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from elastic_tf import batch, keras_model, replay  # noqa: E402


def main():
    import horovod.tensorflow.keras as hvd

    out, epochs, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    wid = os.environ.get("APPLIANCE_ELASTIC_WORKER", "x")

    def write(name, data):
        tmp = os.path.join(out, f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write(data)
        os.replace(tmp, os.path.join(out, name))

    def step_file(kind):
        try:
            with open(os.path.join(out, f"{kind}.{wid}")) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return -1

    write(f"pid.{wid}", str(os.getpid()))
    hvd.init()
    model, opt = keras_model(1234 + hvd.rank())  # only the state's sync makes the ranks agree
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":  # the same network and weights on tf-keras
        legacy = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="tanh"),
                                      tf.keras.layers.Dense(1)])
        legacy.set_weights(model.get_weights())
        model, opt = legacy, tf.keras.optimizers.SGD(opt.learning_rate.numpy(), momentum=opt.momentum)
    model.compile(optimizer=hvd.DistributedOptimizer(opt), loss="mse", jit_compile=False)
    state = hvd.elastic.KerasState(model, epoch=0, batch=0, sizes=[])
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    log = open(os.path.join(out, f"log.{wid}"), "a")

    def step_of():
        return state.epoch * steps + state.batch

    class Evidence(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, b, logs=None):
            if step_file("kill") == step_of() + 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if step_file("grow") == step_of() + 1 and hvd.size() == 1:
                end = time.monotonic() + 120
                while time.monotonic() < end:
                    state.check_host_updates()  # raises HostsUpdatedInterrupt once the new host is known
                    time.sleep(0.05)

        def on_train_batch_end(self, b, logs=None):
            state.sizes = state.sizes + [hvd.size()]
            total = float(sum(tf.reduce_sum(tf.cast(v, tf.float64)) for v in model.variables))
            log.write(json.dumps({"step": step_of(), "epoch": state.epoch, "batch": state.batch,
                                  "size": hvd.size(), "rank": hvd.rank(), "pid": os.getpid(), "sum": total,
                                  "elastic": os.environ.get("HOROVOD_ELASTIC"), "t": time.time()}) + "\n")
            log.flush()

    callbacks = [hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state), Evidence()]

    @hvd.elastic.run
    def train(state):
        first = step_of()  # the committed step: the stream goes on after it, with a spare epoch
        xs, ys = zip(*(batch(g, hvd.rank()) for g in range(first + 1, (epochs + 1) * steps + 1)))
        data = tf.data.Dataset.from_tensor_slices((tf.stack(xs), tf.stack(ys)))
        model.fit(data, epochs=epochs - state.epoch, steps_per_epoch=steps, callbacks=callbacks, verbose=0)

    train(state)
    write(f"done.{wid}", json.dumps({
        "rank": hvd.rank(), "size": hvd.size(), "sizes": state.sizes, "resets": resets, "pid": os.getpid(),
        "epoch": state.epoch, "batch": state.batch,
        "params": [np.asarray(v).ravel().tolist() for v in model.variables],
        "replay": replay(state.sizes, False) if hvd.rank() == 0 else None}))
    hvd.shutdown()


if __name__ == "__main__":
    main()
