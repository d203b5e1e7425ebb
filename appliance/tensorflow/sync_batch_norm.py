"""``hvd.SyncBatchNormalization``: a Keras ``BatchNormalization`` whose training statistics span
every rank.

In training, each rank computes its batch's per-channel mean and variance as the Keras layer does
(``_moments``, masks included), and one allreduce (Sum) of (n * mean, n * mean of squares, n),
with n the values each channel's statistics counted on this rank (the rows, times the spatial
positions, or the mask's true entries), gives the job's mean and variance (``E[x^2] - E[x]^2``):
the statistics of the concatenated batch, also when ranks' batches differ in size or a rank's is
empty (Horovod's weighs every rank's batch equally). The layer normalises with them and updates
its moving statistics with them, so every rank's layer holds the statistics of the concatenated
batch. The allreduce differentiates (its gradient is the summed gradient), so the backward pass
spans the ranks too. Eagerly on one rank, and in inference, it is the Keras layer.

It subclasses ``tf.keras.layers.BatchNormalization`` whichever Keras that is: Keras 3 (TensorFlow
2.16+; ``_moments(inputs, mask)`` over ``self._reduction_axes``, the mask path squeezing its
results) or tf-keras (``TF_USE_LEGACY_KERAS=1``; ``_moments(inputs, reduction_axes, keep_dims,
mask=None)``). Keras 3 runs it eagerly, inside ``tf.function`` and in ``fit``; a traced step
always reduces (it may run later at another size: elastic jobs). Environment: none. Failure
modes: ``ValueError`` for ``fused=True`` (or None), as Horovod's; the collective's errors
(``mpi_ops``).
"""
import tensorflow as tf

from appliance.tensorflow.mpi_ops import Sum, raw_allreduce, size

_KERAS3 = tf.keras.layers.BatchNormalization.__module__.startswith("keras.")  # tf-keras: "tf_keras."


def _counts(inputs, axes, mask, like):
    """How many values each channel's statistics were taken over on this rank, shaped as ``like``."""
    if mask is None:
        n = tf.cast(tf.reduce_prod(tf.gather(tf.shape(inputs), list(axes))), like.dtype)
        return tf.ones_like(like) * n
    weights = tf.broadcast_to(tf.expand_dims(tf.cast(mask, like.dtype), -1), tf.shape(inputs))
    return tf.reshape(tf.reduce_sum(weights, axis=list(axes), keepdims=True), tf.shape(like))


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
        if size() == 1 and tf.executing_eagerly():
            return mean, variance
        if _KERAS3:
            axes, mask = self._reduction_axes, (args[0] if args else kwargs.get("mask"))
        else:
            axes = args[0] if args else kwargs["reduction_axes"]
            mask = args[2] if len(args) > 2 else kwargs.get("mask")
        n = tf.stop_gradient(_counts(inputs, axes, mask, mean))
        # 0 * NaN is 0: an empty batch (Keras 3's moments of nothing) adds nothing
        stacked = tf.stack([tf.math.multiply_no_nan(mean, n),
                            tf.math.multiply_no_nan(variance + tf.math.square(mean), n), n])
        total, total_of_squares, count = tf.unstack(raw_allreduce(stacked, op=Sum))
        group_mean = tf.math.divide_no_nan(total, count)
        group_variance = tf.math.divide_no_nan(total_of_squares, count) - tf.math.square(group_mean)
        return group_mean, tf.math.maximum(group_variance, 0.0)
