"""Local gradient aggregation in TensorFlow 2 (eager, or inside a ``tf.function``): the helper that
Keras's ``DistributedOptimizer(backward_passes_per_step=N)`` and a custom training loop use.

``LocalGradientAggregationHelperEager`` keeps a counter variable and one accumulator variable per
gradient (created at the first call, outside any ``tf.function`` graph). ``compute_gradients(grads,
vars)`` adds the step's gradients to the accumulators and returns their running sums; every
``backward_passes_per_step``-th call returns them reduced over the ranks instead (divided by
``backward_passes_per_step`` when ``average_aggregated_gradients``) and zeroes the accumulators and
the counter. ``apply_gradients(closure, optimizer, grads_and_vars)`` runs the closure only on the
calls that reduced; on the others it counts the optimizer's ``iterations``. The decisions are
``tf.cond``s on the counter, so every rank takes the same branch and a ``tf.function`` traces once.
Gradients of variables registered with ``register_local_var`` are aggregated but never reduced
(scaled by 1/size when ``scale_local_gradients``, as ``reduce_except_local`` says).

No environment. Failure modes: ``ValueError`` for ``backward_passes_per_step`` < 1 and for an
``IndexedSlices`` gradient without ``sparse_as_dense``; collectives fail as ``mpi_ops`` says.
"""
import tensorflow as tf

from appliance.tensorflow.gradient_aggregation import dense, reduce_except_local, var_ref
from appliance.tensorflow.mpi_ops import global_process_set


class LocalGradientAggregationHelperEager:
    """Aggregates gradients over ``backward_passes_per_step`` calls before one reduction."""

    def __init__(self, backward_passes_per_step, allreduce_func, sparse_as_dense, average_aggregated_gradients,
                 process_set=global_process_set, scale_local_gradients=True):
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = backward_passes_per_step
        self.allreduce_grads = allreduce_func
        self.sparse_as_dense = sparse_as_dense
        self.average_aggregated_gradients = average_aggregated_gradients
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self.locally_aggregated_grads = {}  # gradient index -> accumulator
        with tf.init_scope():
            self.counter = tf.Variable(0, trainable=False, name="aggregation_counter")
        self._local_vars = set()

    def register_local_var(self, var):
        """This variable's gradient is this rank's own: aggregated, never reduced."""
        self._local_vars.add(var_ref(var))

    def _accumulator(self, i, grad):
        acc = self.locally_aggregated_grads.get(i)
        if acc is None:
            shape = grad.shape
            if not shape.is_fully_defined():
                raise ValueError(f"gradient {i} has shape {shape}: backward_passes_per_step > 1 needs gradients of "
                                 f"a fixed shape (an accumulator variable holds it)")
            with tf.init_scope():  # a variable of the first trace, outside the function's graph
                acc = tf.Variable(tf.zeros(shape, grad.dtype), trainable=False, name=f"aggregated_grad_{i}")
            self.locally_aggregated_grads[i] = acc
        return acc

    @tf.autograph.experimental.do_not_convert
    def compute_gradients(self, grads, vars):
        """The running sums of the gradients, or on every ``backward_passes_per_step``-th call
        the reduced sums (the accumulators emptied)."""
        grads = [dense(g, self.sparse_as_dense) if g is not None else None for g in grads]
        present = [i for i, g in enumerate(grads) if g is not None]
        sums = [self._accumulator(i, grads[i]).assign_add(grads[i], read_value=True) for i in present]
        with tf.control_dependencies(sums):
            count = self.counter.assign_add(1)
        kept = [vars[i] for i in present]

        def reduce_and_clear():
            reduced = reduce_except_local(self.allreduce_grads, sums, kept, self._local_vars, self.process_set,
                                          self.scale_local_gradients)
            if self.average_aggregated_gradients:
                reduced = [r / self.backward_passes_per_step for r in reduced]
            with tf.control_dependencies(reduced):
                clear = [self.counter.assign(0)] + [self.locally_aggregated_grads[i].assign(tf.zeros_like(grads[i]))
                                                     for i in present]
            with tf.control_dependencies(clear):
                return [tf.identity(r) for r in reduced]

        with tf.control_dependencies([count]):
            out = tf.cond(tf.equal(count, self.backward_passes_per_step), reduce_and_clear,
                          lambda: [tf.identity(s) for s in sums])
        if not isinstance(out, (list, tuple)):
            out = [out]
        result = [None] * len(grads)
        for i, r in zip(present, out):
            result[i] = r
        return result

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, apply_grads_closure, optimizer, *args, **kwargs):
        """``apply_grads_closure()`` on the calls that reduced (the counter back at 0); on the
        others the optimizer's ``iterations`` counts the step, and an optimizer with
        ``_aggregate_gradients`` (tf-keras) sees the step's gradients as its ``apply_gradients``
        would have shown them. Returns whether the closure ran (a bool tensor)."""
        def count_iteration():
            if args and hasattr(optimizer, "_aggregate_gradients"):
                pairs = list(args[0])
                transform = getattr(optimizer, "_transform_unaggregated_gradients", None)
                optimizer._aggregate_gradients(transform(pairs) if transform else pairs)
            iterations = getattr(optimizer, "iterations", None)
            if iterations is not None:
                iterations.assign_add(1)
            return tf.constant(False)

        def apply():
            apply_grads_closure()
            return tf.constant(True)

        return tf.cond(tf.equal(self.counter, 0), apply, count_iteration)
