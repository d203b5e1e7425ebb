"""Rank program for tests/tensorflow/test_tf_elastic.py: a Horovod elastic TensorFlow 2 script as
Horovod's own elastic TF2 test writes it (``import horovod.tensorflow as hvd``, shim/ on PYTHONPATH;
a Keras model, a momentum optimizer, ``DistributedGradientTape`` in a ``tf.function``, a
``TensorFlowKerasState`` and a commit every step; ``vars``: the model as plain ``tf.Variable``s in
a ``TensorFlowState``, trained by hand).

Every rank starts from its own random model (seed 1234 + rank), so only the state's sync makes the
ranks agree. Step s of rank r trains on a batch drawn from seed 1000·s + r, so the committed
training is a pure function of the sizes its steps ran at; at the end the rank recomputes it in
one process (``replay``, rank 0's first model, no collective) and reports both.

``static`` (``elastic_tf.py static``, ranks started without a launcher, tests/runtime/rank_group.py):
a ``TensorFlowState`` of per-rank variables and an attribute, synced from rank 0 when ``run`` starts;
a commit, then changes; the last rank SIGKILLs itself and every other rank's allreduce fails inside
the op: ``run`` restores the commit and, with no elastic launcher to re-form the job, re-raises it
as ``HorovodInternalError`` naming the dead rank. Reports (``_report``) what each survivor saw.

Usage: elastic_tf.py OUT STEPS STEP_S [vars]. ``OUT/stop`` (a step number): finish after that step.
``OUT/kill.W`` (a step number): worker W SIGKILLs itself as it starts that step. Evidence per
worker W (APPLIANCE_ELASTIC_WORKER): ``pid.W``; ``log.W``, one JSON line per step (step, size,
rank, pid, the sum of the model's variables, HOROVOD_ELASTIC); ``done.W`` at the end (sizes,
variables, the replay's variables, resets).
"""
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

LR, MOMENTUM = 0.05, 0.9
SHAPES = [(8, 16), (16,), (16, 1), (1,)]


def initial(seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 0.5, s).astype(np.float32) for s in SHAPES]


def batch(step: int, rank: int):
    rng = np.random.default_rng(1000 * step + rank)
    x = rng.normal(size=(16, 8)).astype(np.float32)
    return tf.constant(x), tf.constant(np.sin(x.sum(1, keepdims=True)))


def keras_model(seed: int):
    import keras

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])
    model.set_weights(initial(seed))
    return model, keras.optimizers.SGD(LR, momentum=MOMENTUM)


class VarsModel:
    """The same network as plain variables, plain SGD applied by hand."""

    def __init__(self, seed: int):
        self.variables = [tf.Variable(v) for v in initial(seed)]

    def __call__(self, x):
        w1, b1, w2, b2 = self.variables
        return tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2) + b2


def loss_of(model, x, y):
    return tf.reduce_mean((model(x) - y) ** 2)


def replay(sizes, use_vars: bool) -> list:
    """The committed training in one process: at step s, the mean gradient of ranks 0..n-1."""
    if use_vars:
        model = VarsModel(1234)
    else:
        model, opt = keras_model(1234)
    for step, n in enumerate(sizes, start=1):
        with tf.GradientTape() as tape:
            loss = tf.add_n([loss_of(model, *batch(step, r)) for r in range(n)]) / n
        variables = model.variables if use_vars else model.trainable_variables
        grads = tape.gradient(loss, variables)
        if use_vars:
            for v, g in zip(variables, grads):
                v.assign_sub(LR * g)
        else:
            opt.apply_gradients(zip(grads, variables))
    return [np.asarray(v).ravel().tolist() for v in model.variables]


def static():
    """The ``static`` case (module docstring)."""
    import horovod.tensorflow as hvd
    from _report import report

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    variables = [tf.Variable(np.full(3, float(rank + 1), np.float32)), tf.Variable(rank, dtype=tf.int64)]
    state = hvd.elastic.TensorFlowState(variables, step=rank, note=f"rank {rank}")
    seen = {}

    @hvd.elastic.run
    def train(state):
        seen["synced"] = [variables[0].numpy().tolist(), int(variables[1].numpy()), state.step, state.note]
        variables[0].assign_add(tf.ones(3))
        state.step = 10
        state.commit()
        variables[0].assign(tf.fill([3], -1.0))
        state.step = 11
        if rank == size - 1:
            report(dict(seen, ok=True, rank=rank))  # what the sync gave the rank that dies
            os.kill(os.getpid(), signal.SIGKILL)
        hvd.allreduce(tf.ones([2]), op=hvd.Sum)
        raise AssertionError("an allreduce with a dead rank did not fail")

    try:
        train(state)
    except hvd.HorovodInternalError as e:
        seen.update(error=str(e), origin_rank=e.origin_rank, kind=type(e).__name__)
    foreign = hvd.elastic.internal_error(tf.errors.UnknownError(None, None, "a script's own failure"))
    report(dict(seen, ok=True, rank=rank, restored=[variables[0].numpy().tolist(), state.step],
                foreign_mapped=foreign is not None))


def main():
    import horovod.tensorflow as hvd

    out, steps, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    use_vars = "vars" in sys.argv[4:]
    wid = os.environ.get("APPLIANCE_ELASTIC_WORKER", "x")

    def write(name, data):
        tmp = os.path.join(out, f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write(data)
        os.replace(tmp, os.path.join(out, name))

    def number(name, default):
        try:
            with open(os.path.join(out, name)) as f:
                return int(f.read().strip() or default)
        except (OSError, ValueError):
            return default

    write(f"pid.{wid}", str(os.getpid()))
    hvd.init()
    if use_vars:
        model = VarsModel(1234 + hvd.rank())
        trainable = model.variables
    else:
        model, opt = keras_model(1234 + hvd.rank())
        trainable = model.trainable_variables

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(model, x, y)
        grads = hvd.DistributedGradientTape(tape).gradient(loss, trainable)
        if use_vars:
            for v, g in zip(trainable, grads):
                v.assign_sub(LR * g)
        else:
            opt.apply_gradients(zip(grads, trainable))
        return loss

    if use_vars:
        state = hvd.elastic.TensorFlowState(model.variables, step=0, sizes=[])
    else:
        state = hvd.elastic.TensorFlowKerasState(model, opt, step=0, sizes=[])
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    log = open(os.path.join(out, f"log.{wid}"), "a")

    @hvd.elastic.run
    def train(state):
        while state.step < min(steps, number("stop", steps)):
            step = state.step + 1
            if number(f"kill.{wid}", -1) == step:
                os.kill(os.getpid(), signal.SIGKILL)
            train_step(*batch(step, hvd.rank()))
            state.sizes = state.sizes + [hvd.size()]
            state.step = step
            total = float(sum(tf.reduce_sum(tf.cast(v, tf.float64)) for v in model.variables))
            log.write(json.dumps({"step": step, "size": hvd.size(), "rank": hvd.rank(), "pid": os.getpid(),
                                  "sum": total, "elastic": os.environ.get("HOROVOD_ELASTIC"), "t": time.time()}) + "\n")
            log.flush()
            time.sleep(step_s)
            state.commit()

    train(state)
    write(f"done.{wid}", json.dumps({
        "rank": hvd.rank(), "size": hvd.size(), "sizes": state.sizes, "resets": resets, "pid": os.getpid(),
        "params": [np.asarray(v).ravel().tolist() for v in model.variables],
        "replay": replay(state.sizes, use_vars) if hvd.rank() == 0 else None}))
    hvd.shutdown()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    static() if sys.argv[1:2] == ["static"] else main()
