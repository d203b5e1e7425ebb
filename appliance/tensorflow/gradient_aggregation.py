"""Local gradient aggregation in graphs (``backward_passes_per_step`` > 1 of the ``tf.compat.v1``
``DistributedOptimizer``), and the split of gradients into reduced and local ones that every
gradient path shares.

``LocalGradientAggregationHelper`` keeps one non-trainable accumulator variable per gradient and a
counter (both in ``LOCAL_VARIABLES``, under the variable scope
``aggregation_variables_<name><rank>``, as Horovod names them). Each run adds the step's gradients
to the accumulators; every ``backward_passes_per_step``-th run reduces the accumulated sums over
the ranks (divided by ``backward_passes_per_step`` when ``average_aggregated_gradients``), resets
the counter, and the optimizer applies them; the other runs apply nothing (the wrapped optimizer's
``iterations``, where it has one, and ``global_step`` still count every run). The decisions are
``tf.cond``s on the counter, so every rank takes the same branch in the same run.

``reduce_except_local`` is the split: gradients of sources registered as local stay this rank's
own (divided by the process set's size when ``scale_local_gradients``, as Horovod does, so a
local gradient has the scale of an averaged one); the others go to the allreduce function.

No environment. Failure modes: ``ValueError`` for ``backward_passes_per_step`` < 1, and for an
``IndexedSlices`` gradient without ``sparse_as_dense`` (an accumulator is dense); collectives fail
as ``mpi_ops`` says.
"""
import tensorflow as tf

from appliance.tensorflow.mpi_ops import global_process_set, size_op


def var_ref(var):
    """A hashable key of a variable: ``tf.Variable.ref()``; a Keras 3 variable's is its
    TensorFlow variable's (it has no ``ref``), so either form of one variable finds the other."""
    if hasattr(var, "ref"):
        return var.ref()
    inner = getattr(var, "_value", None)
    if isinstance(inner, tf.Variable):
        return inner.ref()
    return ("id", id(var))


def _set_size(process_set, dtype):
    """The set's size as a tensor of ``dtype``, read when the graph runs (so a resized job is right)."""
    return tf.cast(size_op(process_set_id=process_set.process_set_id), dtype)


def scale_local(grad, process_set):
    """A local gradient divided by the set's size (``IndexedSlices``: its values)."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / _set_size(process_set, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad / _set_size(process_set, grad.dtype)


@tf.autograph.experimental.do_not_convert
def reduce_except_local(allreduce_grads, grads, variables, local_refs, process_set, scale_local_gradients):
    """``grads`` with every gradient of a variable not in ``local_refs`` (a set of ``var_ref(v)``)
    replaced by ``allreduce_grads(grads, variables)``'s result, and the local ones kept (scaled by
    1/size when asked). None stays None."""
    grads, variables = list(grads), list(variables)
    todo = [i for i, v in enumerate(variables) if var_ref(v) not in local_refs]
    out = list(grads)
    if todo:
        for i, r in zip(todo, allreduce_grads([grads[i] for i in todo], [variables[i] for i in todo])):
            out[i] = r
    if scale_local_gradients and local_refs:
        for i, v in enumerate(variables):
            if var_ref(v) in local_refs and out[i] is not None:
                out[i] = scale_local(out[i], process_set)
    return out


def dense(grad, sparse_as_dense):
    """An accumulator's addend: ``IndexedSlices`` made dense when asked, refused otherwise."""
    if isinstance(grad, tf.IndexedSlices):
        if not sparse_as_dense:
            raise ValueError("IndexedSlices are not supported when `backward_passes_per_step` > 1 and "
                             "`sparse_as_dense` is False.")
        return tf.convert_to_tensor(grad)
    return grad


class LocalGradientAggregationHelper:
    """Aggregates a graph's gradients over ``backward_passes_per_step`` runs before one
    reduction (graph mode: a ``tf.compat.v1`` graph or a ``tf.function``)."""

    _OPTIMIZER_TYPE_KERAS = "optimizer_type_keras"
    _OPTIMIZER_TYPE_LEGACY = "optimizer_type_legacy"

    def __init__(self, backward_passes_per_step, allreduce_func, sparse_as_dense, average_aggregated_gradients,
                 rank, optimizer_type, process_set=global_process_set, scale_local_gradients=True, name=""):
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_grads = allreduce_func
        self.sparse_as_dense = sparse_as_dense
        self.average_aggregated_gradients = average_aggregated_gradients
        self.rank = rank
        self.optimizer_type = optimizer_type
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self.name = name
        self.counter = None
        self.locally_aggregated_grads = []  # one per gradient that is not None
        self._local_vars = set()

    def register_local_var(self, var):
        """This variable's gradient is this rank's own: aggregated, never reduced."""
        self._local_vars.add(var_ref(var))

    def _init_aggregation_vars(self, grads):
        scope = "aggregation_variables_" + self.name + str(self.rank)
        local = tf.compat.v1.GraphKeys.LOCAL_VARIABLES
        with tf.compat.v1.variable_scope(scope, reuse=tf.compat.v1.AUTO_REUSE):
            self.counter = tf.compat.v1.get_variable(
                "aggregation_counter", shape=(), dtype=tf.int32, trainable=False,
                initializer=tf.compat.v1.zeros_initializer(), collections=[local])
            self.locally_aggregated_grads = [
                tf.compat.v1.get_variable(str(i), trainable=False,
                                          initializer=tf.zeros(g.get_shape().as_list(), dtype=g.dtype),
                                          collections=[local, "aggregating_collection"])
                for i, g in enumerate(grads) if g is not None]
        if self.optimizer_type == self._OPTIMIZER_TYPE_KERAS:  # no session hook initializes them
            session = tf.compat.v1.keras.backend.get_session(op_input_list=())
            session.run(tf.compat.v1.variables_initializer([self.counter, *self.locally_aggregated_grads]))

    def _reduced(self, variables):
        """The accumulated sums reduced over the ranks (the counter reset once they are)."""
        sums = [a.read_value() for a in self.locally_aggregated_grads]
        reduced = reduce_except_local(self._allreduce_grads, sums, variables, self._local_vars, self.process_set,
                                      self.scale_local_gradients)
        with tf.control_dependencies([r for r in reduced if r is not None]):
            reset = self.counter.assign(0, use_locking=True)
        divisor = self.backward_passes_per_step if self.average_aggregated_gradients else 1
        with tf.control_dependencies([reset]):
            return [tf.identity(r / divisor) if divisor != 1 else tf.identity(r) for r in reduced]

    @tf.autograph.experimental.do_not_convert
    def compute_gradients(self, grads, vars):
        """The reduced aggregate on every ``backward_passes_per_step``-th run, this run's own
        gradients on the others (which ``apply_gradients`` does not apply)."""
        grads = [dense(g, self.sparse_as_dense) if g is not None else None for g in grads]
        self._init_aggregation_vars(grads)
        present = [i for i, g in enumerate(grads) if g is not None]
        clear = tf.cond(tf.equal(self.counter, 0),
                        lambda: tf.group(*[a.assign(tf.zeros_like(a)) for a in self.locally_aggregated_grads]),
                        tf.no_op)
        with tf.control_dependencies([clear]):
            added = tf.group(*[a.assign_add(grads[i]) for a, i in zip(self.locally_aggregated_grads, present)])
        with tf.control_dependencies([added]):
            counted = self.counter.assign_add(1)
        with tf.control_dependencies([counted]):
            kept = [vars[i] for i in present]
            out = tf.cond(tf.equal(self.counter, self.backward_passes_per_step),
                          lambda: self._reduced(kept),
                          lambda: [tf.identity(grads[i]) for i in present])
        if not isinstance(out, (list, tuple)):
            out = [out]
        result = [None] * len(grads)
        for i, r in zip(present, out):
            result[i] = r
        return result

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, apply_grads_closure, optimizer, *args, **kwargs):
        """``apply_grads_closure()`` on the runs that reduced; the counting of the others."""
        grads = [g for pair in args[0] for g in pair[:1] if g is not None]

        def count_iteration():
            iterations = getattr(optimizer, "iterations", None)
            return iterations.assign_add(1).op if iterations is not None else tf.no_op()

        with tf.control_dependencies([tf.group(*grads)] if grads else []):
            train = tf.cond(tf.equal(self.counter, 0), apply_grads_closure, count_iteration)

        def count_global_step():
            step = kwargs.get("global_step")
            if step is None:
                return tf.no_op()
            return step.assign_add(tf.constant(1, dtype=step.dtype.base_dtype), use_locking=True,
                                   read_value=False)

        with tf.control_dependencies([train]):
            return tf.cond(tf.equal(self.counter, 0), tf.no_op, count_global_step)
