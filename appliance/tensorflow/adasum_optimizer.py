"""``DistributedOptimizer(op=hvd.Adasum)`` for ``tf.compat.v1`` optimizers: Horovod's delta optimizer.

Adasum combines model *updates*, not gradients. Each rank applies its own gradients with the
wrapped optimizer; every ``backward_passes_per_step``-th run (counted from the first) the update
since the last combination is combined over the ranks::

  delta = var - start;  start += Adasum(delta over the ranks);  var = start

``start`` is a non-trainable variable per trained variable (``<var>/delta_start``), set to the
variable's value at the first run. The deltas of one run go as one grouped allreduce with
``op=Adasum``, which the runtime reduces tensor by tensor (its recursive pairwise Adasum; a rank
count that is not a power of 2 is folded in first). The decisions are ``tf.cond``s on a step
counter (``<name>/step_count``), so every rank takes the same branch; it works in a v1 graph and
eagerly (``compute_gradients`` is the wrapped optimizer's).

No environment. Failure modes: Adasum of a non-floating variable is refused by the op (the
runtime's error); collectives fail as ``mpi_ops`` says.
"""
import tensorflow as tf

from appliance.tensorflow.compression import Compression
from appliance.tensorflow.gradient_aggregation import var_ref
from appliance.tensorflow.mpi_ops import Adasum


class DistributedAdasumOptimizer(tf.compat.v1.train.Optimizer):
    """Applies the wrapped optimizer locally and combines the ranks' updates with Adasum."""

    def __init__(self, optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                 compression=Compression.none, backward_passes_per_step=1):
        name = name or f"DistributedDelta{type(optimizer).__name__}"
        super().__init__(name=name, use_locking=use_locking)
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self._optimizer = optimizer
        self._device_dense = device_dense
        self._compression = compression
        self._backward_passes_per_step = int(backward_passes_per_step)
        self._step_count = None
        self._starts = {}  # var_ref(var) -> its start variable

    def _variables_for(self, variables):
        with tf.init_scope():  # the graph's (or eager) variables, not a tf.function's
            if self._step_count is None:
                self._step_count = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                               name=f"{self.get_name()}/step_count")
            for v in variables:
                if var_ref(v) not in self._starts:
                    self._starts[var_ref(v)] = tf.Variable(tf.zeros(v.shape, v.dtype.base_dtype), trainable=False,
                                                        name=f"{v.op.name if hasattr(v, 'op') else 'var'}/delta_start")
        return [self._starts[var_ref(v)] for v in variables]

    def _combine(self, variables, starts):
        from appliance.tensorflow import grouped_allreduce  # the package's (compression, names)

        with tf.device(self._device_dense):
            deltas = [v - s for v, s in zip(variables, starts)]
            reduced = grouped_allreduce(deltas, op=Adasum, compression=self._compression)
        moved = [s.assign_add(r, use_locking=self._use_locking) for s, r in zip(starts, reduced)]
        return tf.group(*[v.assign(m, use_locking=self._use_locking) for v, m in zip(variables, moved)])

    def compute_gradients(self, *args, **kwargs):
        return self._optimizer.compute_gradients(*args, **kwargs)

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = list(grads_and_vars)
        variables = [v for g, v in grads_and_vars if g is not None]
        starts = self._variables_for(variables)
        step = self._step_count
        init = tf.cond(tf.equal(step, 0),
                       lambda: tf.group(*[s.assign(v) for s, v in zip(starts, variables)]), tf.no_op)
        with tf.control_dependencies([init]):
            applied = self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        with tf.control_dependencies([applied] if applied is not None else []):
            is_comm = tf.equal(step % self._backward_passes_per_step, self._backward_passes_per_step - 1)
            combined = tf.cond(is_comm, lambda: self._combine(variables, starts), tf.no_op)
        with tf.control_dependencies([combined]):
            counted = step.assign_add(1)
        return counted.op if hasattr(counted, "op") and not tf.executing_eagerly() else counted

    def get_slot(self, var, name):
        if name == "delta_start" and var_ref(var) in self._starts:
            return self._starts[var_ref(var)]
        return self._optimizer.get_slot(var, name)

    def get_slot_names(self):
        return ["delta_start"] + self._optimizer.get_slot_names()

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)
