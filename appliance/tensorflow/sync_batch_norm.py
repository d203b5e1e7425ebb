"""``hvd.SyncBatchNormalization``: a Keras ``BatchNormalization`` whose training statistics span
every rank.

In training, each rank computes its batch's per-channel mean and variance as the Keras layer does
(``_moments``), turns them into (mean, mean of squares), and one allreduce (Average) of the two
stacked gives the job's mean and variance (``E[x^2] - E[x]^2``), as Horovod does: every rank's
batch counts equally, so ranks are expected to have batches of one size. The layer normalises
with them and updates its moving statistics with them, so every rank's layer holds the statistics
of the concatenated batch. The allreduce differentiates (its gradient is the averaged gradient),
so the backward pass spans the ranks too. On one rank, and in inference, it is the Keras layer.

It subclasses ``tf.keras.layers.BatchNormalization`` whichever Keras that is: Keras 3 (TensorFlow
2.16+; ``_moments(inputs, mask)``) or tf-keras (``TF_USE_LEGACY_KERAS=1``; ``_moments(inputs,
reduction_axes, keep_dims)``); the override passes the arguments through. Keras 3 runs it eagerly
and inside ``tf.function``. Failure modes: ``ValueError`` for ``fused=True`` (or None), as
Horovod's; the collective's errors (``mpi_ops``).
"""
import tensorflow as tf

from appliance.tensorflow.mpi_ops import Average, raw_allreduce, size

_KERAS3 = tf.keras.layers.BatchNormalization.__module__.startswith("keras.")  # tf-keras: "tf_keras."


class SyncBatchNormalization(tf.keras.layers.BatchNormalization):
    """Batch normalization whose training mean and variance are those of every rank's batch."""

    def __init__(self, fused=False, **kwargs):
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        if not kwargs.get("name"):
            kwargs["name"] = "sync_batch_normalization"
        if not _KERAS3:
            kwargs["fused"] = fused  # tf-keras has a fused kernel; Keras 3 has none to turn off
        super().__init__(**kwargs)

    @tf.autograph.experimental.do_not_convert
    def _moments(self, inputs, *args, **kwargs):
        mean, variance = super()._moments(inputs, *args, **kwargs)
        if size() == 1:
            return mean, variance
        stacked = tf.stack([mean, variance + tf.math.square(mean)])
        group_mean, group_mean_of_square = tf.unstack(raw_allreduce(stacked, op=Average))
        return group_mean, group_mean_of_square - tf.math.square(group_mean)
