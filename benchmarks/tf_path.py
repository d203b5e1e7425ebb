"""The TensorFlow path: ``horovod.tensorflow`` on our runtime beside our torch path and TensorFlow's
own ``tf.distribute.MultiWorkerMirroredStrategy``, the same ranks in one run.

Every rank (``appliance.launcher.launch``, ``--np`` ranks on this machine) joins our runtime
(``appliance.tensorflow`` and ``appliance.torch`` share it) and a MultiWorkerMirroredStrategy
cluster (``TF_CONFIG``: one worker per rank on a free localhost port, ring all-reduce), then:

- **allreduce** at each size (default 4 KiB, 64 MiB, 256 MiB; float32, Sum), one after another
  in the same processes so all see the same machine state: ``tf`` (``hvd.allreduce`` eagerly),
  ``tf-fn`` (the same inside a ``tf.function``, one op per call), ``torch``
  (``appliance.torch.allreduce``) and ``mwms`` (a ``tf.function`` running the strategy's
  replica-context ``all_reduce``: its collective ops over gRPC). Times and busbw as
  ``collectives.py`` (the slowest rank's median; busbw = size / time x 2(P-1)/P);
  ``tf-torch us``: what the TF path adds per operation over the torch path.
- **training** (``--no-train`` leaves it out): synthetic images/s of
  ``keras.applications.MobileNetV2`` (width 0.35, 32x32 random images, 10 classes: it trains on
  2 cores in minutes; ``--model tiny``, one convolution, is ``--quick``'s), one ``tf.function``
  step each: ``hvd.DistributedGradientTape`` against ``strategy.run`` of the same step. Blocks of
  ``--steps`` steps alternate between the two for ``--rounds`` rounds; images/s is the global
  batch x steps / a block's wall time on rank 0, the median round shown beside every round.
  With tf-keras installed, two more blocks alternate with them: Keras ``fit`` of the same model
  with ``horovod.tensorflow.keras``'s ``DistributedOptimizer`` (``keras-fit``) against ``fit``
  under the strategy (``mwms-fit``), on tf-keras (the ranks run with ``TF_USE_LEGACY_KERAS=1``):
  Keras 3's ``fit`` does not run under the strategy at two workers (``_fit_blocks``).

    python benchmarks/tf_path.py                      # ~5-10 min on 2 cores
    python benchmarks/tf_path.py --quick              # seconds: 4K and 64K, a tiny model, 2 steps
    python benchmarks/tf_path.py --sizes 4K --no-train --iters 300 --json out.json
    python benchmarks/tf_path.py --sizes 4K --no-train --iters 3000 --realtime   # per-op cost, root

``--realtime`` (root or CAP_SYS_NICE) runs the allreduce sweep with every thread of each rank at
SCHED_FIFO, so a small op's time is the paths' own, not the scheduler's, on a shared machine.
TensorFlow runs one intra-op thread per core share (cores / ranks), torch the same. Needs
TensorFlow (the ``tensorflow`` extra) and torch (``bench``). Failure modes: ranks that fail make
the script exit with their output's end; a port taken between choosing and binding fails the
strategy's start (rerun).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import time

import benchlib as bl

BACKENDS = ("tf", "tf-fn", "torch", "mwms")
DEFAULT_SIZES = "4K,64M,256M"
MODELS = ("mobilenetv2", "tiny")


def free_ports(n: int) -> list:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# --- the ranks ---------------------------------------------------------------------------------
def _strategy(rank: int, ports: list):
    """The MultiWorkerMirroredStrategy of this rank: created before any TF op runs (it configures
    the eager context's collectives)."""
    import tensorflow as tf

    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                                          "task": {"type": "worker", "index": rank}})
    ring = tf.distribute.experimental.CommunicationImplementation.RING
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=ring))


def _calls(n, hvd, thvd, torch, tf, strategy):
    """{backend: a callable running one allreduce of n float32} (fresh buffers)."""
    x = tf.ones([n], tf.float32)
    t = torch.ones(n)
    fn = tf.function(lambda v: hvd.allreduce(v, op=hvd.Sum, name=f"bench.tf_fn.{n}"))

    def replica(v):
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(v))

    mwms = tf.function(lambda v: strategy.run(replica, args=(v,)))
    return {"tf": lambda: hvd.allreduce(x, op=hvd.Sum), "tf-fn": lambda: fn(x),
            "torch": lambda: thvd.allreduce(t, op=thvd.Sum), "mwms": lambda: mwms(x)}


def _model(kind: str, keras, classes: int):
    if kind == "mobilenetv2":
        return keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=classes)
    layers = keras.layers
    return keras.Sequential([keras.Input((32, 32, 3)), layers.Conv2D(8, 3, activation="relu"), layers.GlobalAveragePooling2D(),
                             layers.Dense(classes, activation="softmax")])


def _train(args, hvd, rt, tf, strategy) -> dict:
    """{backend: [images/s of each round]} on rank 0 (hvd's DistributedGradientTape and MWMS)."""
    import keras

    batch, classes, size = args.batch, 10, hvd.size()
    imgs = tf.random.uniform([batch, 32, 32, 3], seed=1)
    labels = tf.random.uniform([batch], 0, classes, tf.int32, seed=2)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction="none")

    ours, opt = _model(args.model, keras, classes), keras.optimizers.SGD(0.01)
    # Keras 3's variables hold tf.Variables (.value), which the tape and broadcast_variables take
    ours_vars = [getattr(v, "value", v) for v in ours.trainable_variables]
    hvd.broadcast_variables([getattr(v, "value", v) for v in ours.variables], root_rank=0)

    @tf.function
    def ours_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(labels, ours(imgs, training=True)))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, ours_vars)
        opt.apply_gradients(zip(grads, ours.trainable_variables))
        return loss

    with strategy.scope():
        theirs, their_opt = _model(args.model, keras, classes), keras.optimizers.SGD(0.01)

    def replica():
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(labels, theirs(imgs, training=True)), global_batch_size=batch * size)
        grads = tape.gradient(loss, theirs.trainable_variables)
        their_opt.apply_gradients(zip(grads, theirs.trainable_variables))
        return loss

    mwms_step = tf.function(lambda: strategy.run(replica))

    def loop(step):
        def block():
            for _ in range(args.steps):
                loss = step()
            float(loss)
        return block

    blocks = {"tf-tape": loop(ours_step), "mwms": loop(mwms_step), **_fit_blocks(args, size, tf, strategy, imgs, labels)}
    for block in blocks.values():  # trace and warm up
        block()
    out: dict = {b: [] for b in blocks}
    for _ in range(args.rounds):
        for name, block in blocks.items():
            rt.barrier()
            t0 = time.perf_counter()
            block()
            rt.barrier()
            out[name].append(batch * size * args.steps / (time.perf_counter() - t0))
    return out


def _fit_blocks(args, size, tf, strategy, imgs, labels) -> dict:
    """{backend: a block of ``--steps`` steps of ``fit``}, on tf-keras (the ranks run with
    ``TF_USE_LEGACY_KERAS=1``; Keras 3's ``fit`` under MultiWorkerMirroredStrategy fails at two
    workers, ``Invalid reduction dimension 0`` in its train function, tensorflow/tensorflow#72388):
    ``keras-fit``, the model compiled with ``horovod.tensorflow.keras``'s DistributedOptimizer
    (rank 0's weights broadcast in the warm-up), against ``mwms-fit``, the same model compiled in
    the strategy's scope; each rank's batch the same (the strategy's dataset is the global batch,
    every worker reading all of it, the strategy splitting it). One ``fit`` (epochs=1) per block:
    its per-call setup is counted. {} without tf-keras."""
    if not _tf_keras():
        return {}
    import appliance.tensorflow.keras as hk

    keras = tf.keras

    def dataset(n):
        ds = tf.data.Dataset.from_tensor_slices((imgs, labels)).repeat().batch(n, drop_remainder=True)
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return ds.with_options(opts)

    loss = "sparse_categorical_crossentropy"
    ours = _model(args.model, keras, 10)
    ours.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss=loss, jit_compile=False)
    with strategy.scope():
        theirs = _model(args.model, keras, 10)
        theirs.compile(optimizer=keras.optimizers.SGD(0.01), loss=loss, jit_compile=False)
    ours_data, their_data = dataset(args.batch), dataset(args.batch * size)
    first = [hk.callbacks.BroadcastGlobalVariablesCallback(0)]

    def ours_block():
        ours.fit(ours_data, epochs=1, steps_per_epoch=args.steps, verbose=0, callbacks=first)
        first.clear()  # the broadcast once, in the warm-up

    return {"keras-fit": ours_block,
            "mwms-fit": lambda: theirs.fit(their_data, epochs=1, steps_per_epoch=args.steps, verbose=0)}


def _tf_keras() -> bool:
    import importlib.util

    return importlib.util.find_spec("tf_keras") is not None


def _realtime(on: bool) -> None:
    """Every thread of this rank (TensorFlow's, torch's, the runtime's) at SCHED_FIFO, or back to
    SCHED_OTHER: ``--realtime``'s allreduce sweep, where the machine's other jobs do not count."""
    policy, prio = (os.SCHED_FIFO, 10) if on else (os.SCHED_OTHER, 0)
    try:
        os.sched_setscheduler(0, policy, os.sched_param(prio))
    except PermissionError:
        raise SystemExit("--realtime needs root or CAP_SYS_NICE (SCHED_FIFO)") from None
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(tid), policy, os.sched_param(prio))
        except OSError:  # a thread that has ended
            pass


def worker(args) -> None:
    import numpy as np
    import tensorflow as tf

    import appliance.runtime as rt
    import appliance.tensorflow as hvd

    threads = bl.threads_per_rank(args.np)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    hvd.init()
    strategy = _strategy(hvd.rank(), [int(p) for p in args.ports.split(",")])
    import torch

    import appliance.torch as thvd

    torch.set_num_threads(threads)
    p = hvd.size()
    cells = [(max(1, s // 4), s) for s in bl.parse_sizes(args.sizes)]
    realtime = False
    if args.realtime:
        _realtime(True)
        realtime = os.sched_getscheduler(0) == os.SCHED_FIFO
    try:
        samples = bl.sweep(cells, lambda c: _calls(c[0], hvd, thvd, torch, tf, strategy), rt.barrier,
                           lambda c: bl.iters_for(c[1], args.iters))
    finally:
        if args.realtime:
            _realtime(False)
    keys = sorted(samples)
    med = rt.allreduce(np.array([bl.median(samples[k]) for k in keys], np.float64), op=rt.Max, name="bench.median")
    rows = [{"op": "allreduce", "bytes": size, "backend": b, "time_s": float(t), "iters": len(samples[(n, size), b])}
            for ((n, size), b), t in zip(keys, med)]
    train = _train(args, hvd, rt, tf, strategy) if args.train else {}
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "train": train, "realtime": realtime}, f)
    rt.barrier()


# --- the driver --------------------------------------------------------------------------------
def print_tables(result, file=sys.stdout) -> None:
    p, rows = result["np"], result["rows"]
    by = {(r["bytes"], r["backend"]): r for r in rows}
    print(f"\nallreduce, float32, {p} ranks: median time of the slowest rank (us) | busbw GB/s | "
          f"tf-torch: us the TF path adds | tf/torch busbw | mwms/tf time (>1: ours faster)", file=file)
    print(f"{'size':>6} " + " ".join(f"{b:>9}" for b in BACKENDS) + " | " + " ".join(f"{b:>7}" for b in BACKENDS)
          + f" | {'tf-torch us':>11} {'tf/torch bw':>11} {'mwms/tf':>8} {'mwms/tf-fn':>10}", file=file)
    for s in sorted({r["bytes"] for r in rows}):
        c = {b: by.get((s, b)) for b in BACKENDS}
        t = {b: (c[b]["time_s"] if c[b] else None) for b in BACKENDS}
        line = f"{bl.human(s):>6} " + " ".join(f"{bl.fmt_us(t[b]):>9}" for b in BACKENDS)
        line += " | " + " ".join(f"{c[b]['busbw_GBps']:>7.2f}" if c[b] else f"{'-':>7}" for b in BACKENDS)
        extra = f"{(t['tf'] - t['torch']) * 1e6:.1f}" if t["tf"] and t["torch"] else "-"
        line += f" | {extra:>11} {bl.fmt_ratio(t['torch'], t['tf']):>11} {bl.fmt_ratio(t['mwms'], t['tf']):>8}"
        line += f" {bl.fmt_ratio(t['mwms'], t['tf-fn']):>10}"
        print(line, file=file)
    train = result.get("train") or {}
    if train:
        print(f"\ntraining, {result['model']}, {p} ranks, batch {result['batch']} per rank: images/s (global), "
              f"median of {len(train['tf-tape'])} rounds [every round]", file=file)
        med = {b: bl.median(v) for b, v in train.items()}
        for b, v in train.items():
            print(f"{b:>9} {med[b]:>9.1f}  [" + ", ".join(f"{x:.1f}" for x in v) + "]", file=file)
        print(f"tf-tape/mwms: {med['tf-tape'] / med['mwms']:.2f}", file=file)
        if "keras-fit" in med:
            print(f"keras-fit/mwms-fit: {med['keras-fit'] / med['mwms-fit']:.2f}", file=file)


def add_bandwidth(rows, p) -> None:
    for r in rows:
        r["algbw_GBps"] = r["bytes"] / r["time_s"] / 1e9
        r["busbw_GBps"] = r["algbw_GBps"] * 2 * (p - 1) / p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--sizes", default=None, help=f"comma list or a range of powers of 4 (default {DEFAULT_SIZES})")
    ap.add_argument("--iters", type=int, default=None, help="samples per size up to 1 MiB, fewer above (default 60)")
    ap.add_argument("--no-train", dest="train", action="store_false", help="leave the training comparison out")
    ap.add_argument("--model", choices=MODELS, default=None, help="mobilenetv2 (default) or tiny (--quick's)")
    ap.add_argument("--batch", type=int, default=32, help="images per rank per step (default 32)")
    ap.add_argument("--steps", type=int, default=None, help="steps per timed block (default 10)")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3)")
    ap.add_argument("--quick", action="store_true", help="seconds: 4K and 64K, 5 samples, the tiny model, 2 steps")
    ap.add_argument("--realtime", action="store_true",
                    help="the ranks' threads at SCHED_FIFO during the allreduce sweep (root): other jobs do not count")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ports", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.sizes = a.sizes or ("4K,64K" if a.quick else DEFAULT_SIZES)
    a.iters = a.iters or (5 if a.quick else 60)
    a.model = a.model or ("tiny" if a.quick else "mobilenetv2")
    a.steps = a.steps or (2 if a.quick else 10)
    a.rounds = a.rounds or (1 if a.quick else 3)
    if a.worker:
        worker(a)
        return 0
    from appliance.launcher import launch

    machine = bl.machine_line()
    out = bl.result_path("tf_path")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--np", str(a.np), "--sizes", a.sizes,
           "--iters", str(a.iters), "--model", a.model, "--batch", str(a.batch), "--steps", str(a.steps),
           "--rounds", str(a.rounds), "--ports", ",".join(map(str, free_ports(a.np))), "--out", out]
    if not a.train:
        cmd.append("--no-train")
    if a.realtime:
        cmd.append("--realtime")
    res = launch(cmd, np=a.np, timeout=3600, env={"TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "1"})
    if res.returncode != 0:
        raise SystemExit(f"ranks failed (rc={res.returncode}):\n{bl.ranks_output(res)}")
    with open(out) as f:
        got = json.load(f)
    add_bandwidth(got["rows"], a.np)
    result = {"np": a.np, "cpus": os.cpu_count(), "machine": machine, "model": a.model, "batch": a.batch, **got}
    print(f"{a.np} ranks; host {platform.node()}: {machine}; load at end "
          + "/".join(f"{x:.1f}" for x in os.getloadavg()) + ("; allreduces at SCHED_FIFO" if got["realtime"] else ""))
    print_tables(result)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
