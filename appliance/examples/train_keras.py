"""The Keras example job: the default job's model and data, trained with Keras ``fit`` on every rank.

The same MLP on the same split of scikit-learn's bundled digits as the default job
(``appliance.examples.train``; the data and the share layout come from ``appliance.examples.share``),
written the way a Keras user adapts a single-process ``fit`` script to Horovod: ``hvd.init()``, the
optimizer wrapped in ``hvd.DistributedOptimizer`` (gradients averaged over the ranks at every
step), ``BroadcastGlobalVariablesCallback(0)`` (every rank starts from rank 0's weights) and
``MetricAverageCallback`` (the epoch's loss and held-out accuracy averaged over the ranks), with
``hvd`` being ``horovod.tensorflow.keras`` (``appliance.tensorflow.keras``). Keras 3 (TensorFlow's
``tf.keras``) by default; tf-keras with ``TF_USE_LEGACY_KERAS=1``.

``--batch-size`` is the global batch: rank r of N trains on every N-th training sample from
index r (cut so that every rank has the same number of steps), ``batch_size // N`` of them a step;
the test images are split the same way for the held-out accuracy. A ``ProgressCallback`` reports
every step and its samples to the launcher (``appliance.runtime.progress``: the live view, the
record, report.png), as the default job's optimizer does.

Rank 0 alone writes, after every epoch: ``checkpoint.keras`` (``model.save``, then renamed into
place atomically) and ``metrics.json`` (every epoch's loss, accuracy, seconds and size), into
``<shared>/models/<run>/`` (``--shared``: default ``APPLIANCE_SHARED`` when that directory exists,
else the working directory; ``--run``: default ``digits-keras``) while holding the run's job lock
``<shared>/locks/run-<run>.lock``: a second job on the same run stops at once (exit 3 on every
rank) with a message naming the first one's host, pid and start time. ``--checkpoint-dir DIR``
writes into DIR instead, without the lock. Each run trains from scratch and replaces the run's
checkpoint (the default job resumes; this one does not). Not elastic: a lost rank ends the job,
as any static Horovod job.

Rank 0's first line names every rank's host (``hosts: rank 0 H0, rank 1 H1``), its last a digest
of every rank's weights (``weights sha256:``): equal digests, one model.

Env vars: APPLIANCE_SHARED and APPLIANCE_JOB_ID (through ``share``), TF_USE_LEGACY_KERAS
(TensorFlow's: which Keras). Failure modes: exit 3 on every rank when another job holds the run;
exit 2 with one line when TensorFlow does not import or ``--batch-size`` leaves no step; a lost
rank ends the job (the launcher's message names it).

Run: ``appliance launch -np 2 -H localhost:2 -- python -m appliance.examples.train_keras``
(``python -m train_keras`` in the image; on its own: a single rank).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import signal
import sys
import tempfile
import time

from appliance.examples import share

CHECKPOINT = "checkpoint.keras"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    share.add_training_args(p)
    share.add_run_args(p, "digits-keras")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "hidden"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def save_model(model, path: str) -> None:
    """``model.save`` (Keras wants a ``.keras`` path) into a private directory, then its bytes
    renamed into ``path`` atomically: a reader or a crash sees the old checkpoint or the new one."""
    from appliance.mount import save_atomically

    with tempfile.TemporaryDirectory(prefix="appliance-keras-") as tmp:
        staged = os.path.join(tmp, CHECKPOINT)
        model.save(staged)
        with open(staged, "rb") as f:
            data = f.read()
    save_atomically(lambda f: f.write(data), path)


def weights_digest(model) -> str:
    """sha256 over the model's weights, in order, as bytes (equal models, equal digests)."""
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(w.tobytes())
    return h.hexdigest()[:16]


def callbacks(keras, hvd, progress, args, checkpoint_dir: str, samples_per_step: int, total_steps: int):
    """(Horovod's two, the progress reporter and rank 0's epoch line and checkpoint, in that order:
    the metrics are averaged before rank 0 prints and saves them; the list the epochs' metrics go to)."""
    rank, size = hvd.rank(), hvd.size()
    config = {"hidden": args.hidden, "lr": args.lr, "batch_size": args.batch_size, "seed": args.seed}

    class ProgressCallback(keras.callbacks.Callback):
        """Every step of ``fit`` and its samples, to the metrics a rank publishes."""

        def on_train_begin(self, logs=None):
            progress.progress(total=total_steps, samples_per_step=samples_per_step)

        def on_train_batch_end(self, batch, logs=None):
            progress.step()

    class EpochEnd(keras.callbacks.Callback):
        """Rank 0: the epoch's line, then the checkpoint and metrics.json."""

        def __init__(self):
            super().__init__()
            self.history: list = []
            self.started = 0.0

        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            done = {"epoch": epoch + 1, "loss": float(logs["loss"]), "accuracy": float(logs["val_accuracy"]),
                    "seconds": time.perf_counter() - self.started, "size": size}
            self.history.append(done)
            if rank != 0:
                return
            print(f"epoch {done['epoch']}/{args.epochs}: loss {done['loss']:.4f} accuracy {done['accuracy']:.4f} "
                  f"time {done['seconds']:.3f}s ranks {size}", flush=True)
            if checkpoint_dir:
                from appliance.mount import write_json

                os.makedirs(checkpoint_dir, exist_ok=True)
                save_model(self.model, os.path.join(checkpoint_dir, CHECKPOINT))
                write_json(os.path.join(checkpoint_dir, share.METRICS),
                           {"size": size, "config": config, "writer": {"rank": rank, "pid": os.getpid()},
                            "epochs": self.history})

    epochs = EpochEnd()
    return [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
            ProgressCallback(), epochs], epochs.history


def main(argv=None) -> int:
    args = parse_args(argv)
    # SIGTERM (how the launcher stops ranks) unwinds like an exception: the run lock is released.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        import tensorflow as tf
    except ImportError as e:  # an image built with --no-tensorflow, a venv without it
        print(f"train_keras: TensorFlow does not import ({e}): the Keras job needs it "
              "(pip install -e '.[tensorflow]'; the image has it unless built with --no-tensorflow)",
              file=sys.stderr, flush=True)
        return 2

    import appliance.tensorflow as hvd_tf
    import appliance.tensorflow.keras as hvd
    from appliance.runtime import progress

    keras = tf.keras
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(args.seed + rank)  # any start: rank 0's weights are broadcast
    x_train, y_train, x_test, y_test = share.load_digits_arrays(args.seed)
    local_batch = max(1, args.batch_size // size)
    steps = len(x_train) // (local_batch * size)
    if steps < 1:
        print(f"train_keras: --batch-size {args.batch_size} leaves no step of {local_batch * size} samples "
              f"in {len(x_train)}", file=sys.stderr, flush=True)
        return 2
    xs, ys = x_train[rank::size][:steps * local_batch], y_train[rank::size][:steps * local_batch]
    model = keras.Sequential([keras.Input((x_train.shape[1],)), keras.layers.Dense(args.hidden, activation="relu"),
                              keras.layers.Dense(10)])
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=args.lr, momentum=0.9))
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    checkpoint_dir, layout = share.checkpoint_target(args)

    with contextlib.ExitStack() as stack:
        writer = stack.enter_context(share.run_lock(layout, args.run, "train_keras")) if layout else None
        stop = None
        if rank == 0:
            from appliance.mount import LockHeld

            try:
                share.take_the_run(writer, checkpoint_dir, (CHECKPOINT, share.METRICS))
            except LockHeld as e:  # another job writes this run
                stop = (3, str(e))
        stop = hvd_tf.broadcast_object(stop, root_rank=0, name="stop")
        if stop:  # every rank stops with rank 0's code
            if rank == 0:
                print(f"train_keras: {stop[1]}", file=sys.stderr, flush=True)
            return stop[0]
        hosts = hvd_tf.allgather_object(os.uname().nodename, name="hosts")
        if rank == 0:
            print("hosts: " + ", ".join(f"rank {r} {h}" for r, h in enumerate(hosts)), flush=True)
            keras_name = "tf-keras" if "tf_keras" in type(model).__module__ else "Keras 3"
            print(f"training an MLP on {len(x_train)} digits with Keras fit ({keras_name}) on {size} rank(s), "
                  f"global batch {local_batch * size} (rank r takes every {size}-th sample from index r), "
                  f"{steps} steps/epoch", flush=True)
        fit_callbacks, history = callbacks(keras, hvd, progress, args, checkpoint_dir, local_batch, steps * args.epochs)
        model.fit(xs, ys, batch_size=local_batch, epochs=args.epochs, shuffle=True, verbose=0,
                  validation_data=(x_test[rank::size], y_test[rank::size]), callbacks=fit_callbacks)
        digests = hvd_tf.allgather_object(weights_digest(model), name="digests")
        if rank == 0:
            where = f"; checkpoint in {checkpoint_dir}" if checkpoint_dir else ""
            print(f"final accuracy {history[-1]['accuracy']:.4f} after {len(history)} epochs{where}", flush=True)
            print("weights sha256: " + ", ".join(f"rank {r} {d}" for r, d in enumerate(digests)), flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
