"""A TensorFlow rank for tests/launcher/slurm/test_srun_tensorflow.py: ``horovod.tensorflow``
(shim/ on PYTHONPATH) started by srun, by ``appliance launch`` in an allocation or directly.

Usage: slurm_tf.py OUTDIR TAG. One training step of a linear model through
``DistributedGradientTape`` in a ``tf.function`` after ``broadcast_variables`` (every rank starts from
its own random weights), an allreduce and an allgather; every rank recomputes what every other rank
fed in with numpy and checks the results. Writes ``OUTDIR/TAG.<rank>.json``: layout, node, Slurm's
view, the checks and the weights after the step.
"""
import json
import os
import socket
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402

LR = 0.1


def batch(rank: int):
    x = np.random.default_rng(100 + rank).normal(size=(8, 4)).astype(np.float32)
    return x, x.sum(1, keepdims=True)


out_dir, tag = sys.argv[1], sys.argv[2]
hvd.init()
rank, size = hvd.rank(), hvd.size()
w = tf.Variable(np.random.default_rng(rank).normal(size=(4, 1)).astype(np.float32))
hvd.broadcast_variables([w], root_rank=0)
w0 = w.numpy().copy()


@tf.function
def step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
    grad = hvd.DistributedGradientTape(tape).gradient(loss, [w])[0]
    w.assign_sub(LR * grad)
    return grad


grad = step(*map(tf.constant, batch(rank))).numpy()
want = np.mean([2.0 * x.T @ (x @ w0 - y) / len(x) for x, y in map(batch, range(size))], axis=0)
total = hvd.allreduce(tf.constant([float(rank + 1)] * 3), op=hvd.Sum).numpy().tolist()
gathered = hvd.allgather(tf.constant([[rank]] * (rank + 1))).numpy().ravel().tolist()
report = {
    "rank": rank, "size": size, "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
    "cross_rank": hvd.cross_rank(), "hostname": socket.gethostname(),
    "slurm": {k: os.environ.get(k) for k in ("SLURM_PROCID", "SLURMD_NODENAME", "SLURM_STEP_ID")},
    "grad_ok": bool(np.allclose(grad, want, rtol=1e-4, atol=1e-5)),
    "w_ok": bool(np.allclose(w.numpy(), w0 - LR * want, rtol=1e-4, atol=1e-5)),
    "w0": w0.ravel().tolist(), "sum": total, "gathered": gathered,
}
hvd.shutdown()
tmp = os.path.join(out_dir, f".{tag}.{rank}.tmp")
with open(tmp, "w") as f:
    json.dump(report, f)
os.replace(tmp, os.path.join(out_dir, f"{tag}.{rank}.json"))
