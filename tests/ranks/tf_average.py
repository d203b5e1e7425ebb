"""A TensorFlow rank for the image's tests (tests/cluster/test_cluster_tf.py, tests/k8s/test_k8s_tf.py):
a linear model trained a few steps with ``hvd.DistributedGradientTape``, eagerly and in a
``tf.function`` by turns, every rank on its own data from its own initial weights
(``broadcast_variables`` makes them rank 0's). Prints one JSON line: rank, size, host, uid,
TensorFlow's version, the op library it loaded, its first step's local and averaged gradients,
its final weights. Run as a file or as ``python -c`` (no imports of its own directory)."""
import json
import os
import socket

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd
from appliance.tensorflow import _library

hvd.init()
r = hvd.rank()
tf.random.set_seed(100 + r)                      # different initial weights on every rank
w = tf.Variable(tf.random.normal([4, 1]))
b = tf.Variable(tf.zeros([1]))
hvd.broadcast_variables([w, b], root_rank=0)
rng = np.random.default_rng(r)                   # different data on every rank
truth = np.array([[1.0], [-2.0], [3.0], [0.5]], np.float32)


def grads(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
    local = tape.gradient(loss, [w, b])
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
    return local, hvd.DistributedGradientTape(tape).gradient(loss, [w, b])


graph_grads = tf.function(grads)
first = None
for step in range(6):
    x = rng.normal(size=(16, 4)).astype(np.float32)
    local, avg = (grads if step % 2 == 0 else graph_grads)(x, x @ truth)
    if first is None:
        first = ([g.numpy().ravel().tolist() for g in local], [g.numpy().ravel().tolist() for g in avg])
    for v, g in zip((w, b), avg):
        v.assign_sub(0.1 * g)
print(json.dumps({"rank": r, "size": hvd.size(), "host": socket.gethostname(), "uid": os.getuid(),
                  "tf": tf.__version__, "library": str(_library.build()), "local": first[0], "avg": first[1],
                  "w": w.numpy().ravel().tolist(), "b": b.numpy().ravel().tolist()}), flush=True)
hvd.shutdown()
