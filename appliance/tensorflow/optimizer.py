"""Reducing gradients over the ranks: ``DistributedGradientTape`` and
``PartialDistributedGradientTape`` (TensorFlow 2) and ``DistributedOptimizer`` (``tf.compat.v1``
optimizers), with Horovod's arguments and defaults.

Eagerly, one step's allreduces run inside one ``tf.function`` (built once per tape or optimizer
configuration), so they are all in flight together and the runtime fuses them; in a graph they
are graph ops already. ``gradient_predivide_factor`` splits Average's division into a prescale
of 1/f and a postscale of f (the core divides by the size too). ``sparse_as_dense`` turns
``IndexedSlices`` into dense tensors first; otherwise they go as two allgathers.
``num_groups``/``groups`` bundle gradients into grouped allreduces. ``op=Adasum`` reduces the
tape's gradients with the runtime's Adasum; the v1 optimizer with Adasum is the delta optimizer
(``adasum_optimizer``). Local sources (``register_local_source``/``register_local_var``, a partial
tape's ``local_layers``) keep their gradients, scaled by 1/size when ``scale_local_gradients``
(``gradient_aggregation.reduce_except_local``). The v1 optimizer's ``backward_passes_per_step``
aggregates in graphs (``gradient_aggregation``).

Failure modes: Keras optimizers (``tf.keras.optimizers``) are refused with a ValueError (their
``apply_gradients`` path is Keras's: horovod.tensorflow.keras); ``backward_passes_per_step`` > 1
with the v1 optimizer eagerly is a ValueError, as in Horovod; collectives fail as ``mpi_ops`` says.
"""
import tensorflow as tf

from appliance.tensorflow.adasum_optimizer import DistributedAdasumOptimizer
from appliance.tensorflow.compression import Compression
from appliance.tensorflow.gradient_aggregation import LocalGradientAggregationHelper, reduce_except_local, var_ref
from appliance.tensorflow.mpi_ops import Adasum, Average, global_process_set, rank

_functions: dict = {}  # configuration -> tf.function averaging a list of gradients


def split_list(items: list, n: int) -> list:
    """``items`` in ``n`` consecutive groups as even as possible (Horovod's split_list)."""
    d, r = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + d + (1 if i < r else 0)
        if end > start:
            out.append(items[start:end])
        start = end
    return out


@tf.autograph.experimental.do_not_convert
def _allreduce_grads(grads, variables, cfg):
    """The averaged gradients (None stays None), as ``cfg`` says."""
    from appliance.tensorflow import allreduce, grouped_allreduce  # the package's, with IndexedSlices

    compression, sparse_as_dense, op, predivide, groups, process_set = cfg
    if process_set.process_set_id != 0 and process_set.included() is False:
        return list(grads)  # a rank outside the set keeps its own gradients, as Horovod's
    pre, post = (1.0 / predivide, predivide) if op == Average else (1.0, 1.0)
    if sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    kw = dict(compression=compression, op=op, prescale_factor=pre, postscale_factor=post, process_set=process_set)
    present = [(i, g) for i, g in enumerate(grads) if g is not None]
    out = list(grads)
    if groups is None or groups == 0 or not present:
        for i, g in present:
            out[i] = allreduce(g, **kw)
        return out
    if isinstance(groups, int):
        bundles = split_list(present, groups)
    else:  # lists of variables: their gradients go together, the rest one by one
        index = {var_ref(v): i for i, v in enumerate(variables)}
        taken, bundles = set(), []
        for group in groups:
            b = [(index[var_ref(v)], grads[index[var_ref(v)]]) for v in group
                 if var_ref(v) in index and grads[index[var_ref(v)]] is not None]
            taken.update(i for i, _ in b)
            if b:
                bundles.append(b)
        bundles += [[(i, g)] for i, g in present if i not in taken]
    for b in bundles:
        for (i, _), r in zip(b, grouped_allreduce([g for _, g in b], **kw)):
            out[i] = r
    return out


def _averager(cfg):
    """A callable averaging (grads, variables): a tf.function when called eagerly."""
    def run(grads, variables):
        if not tf.executing_eagerly():
            return _allreduce_grads(grads, variables, cfg)
        groups = cfg[4] if isinstance(cfg[4], int) else (
            tuple(tuple(var_ref(v) for v in g) for g in cfg[4]), tuple(var_ref(v) for v in variables))
        key = (*cfg[:4], groups, id(cfg[5]))
        fn = _functions.get(key)
        if fn is None:
            fn = _functions[key] = tf.function(lambda gs: _allreduce_grads(gs, variables, cfg))
        return fn(grads)
    return run


def _config(compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups, process_set):
    if op is None:
        op = Average
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if groups is not None and num_groups:
        raise ValueError("Please set either num_groups or groups, not both")
    if isinstance(groups, int) and not isinstance(groups, bool) and groups > 0:  # Horovod's: a number of groups
        groups, num_groups = None, groups
    if groups is not None and not (isinstance(groups, list) and all(isinstance(g, list) for g in groups)):
        raise ValueError("groups should be a list of lists of tf.Variable")
    return (compression, bool(sparse_as_dense), op, float(gradient_predivide_factor),
            groups if groups is not None else int(num_groups or 0), process_set)


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=global_process_set, scale_local_gradients=True):
    """``gradtape`` whose ``gradient()`` returns the gradients reduced over the ranks (an
    instance of a subclass of the tape's own class, holding the recorded tape). Gradients of
    sources given to ``register_local_source`` stay this rank's own (divided by the set's size
    when ``scale_local_gradients``)."""
    average = _averager(_config(compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups,
                                process_set))
    local = set()

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None, use_generic_names=False):
        grads = super(cls, self).gradient(target, sources, output_gradients)
        flat_sources, flat_grads = tf.nest.flatten(sources), tf.nest.flatten(grads, expand_composites=False)
        flat_grads = reduce_except_local(average, flat_grads, flat_sources, local, process_set, scale_local_gradients)
        return tf.nest.pack_sequence_as(grads, flat_grads)

    def register_local_source(self, source):
        """This variable's gradient stays this rank's own."""
        local.add(var_ref(source))

    @tf.autograph.experimental.do_not_convert
    def get_local_and_global_gradients(self, target, sources, output_gradients=None, use_generic_names=False):
        """(local [(source, gradient)], reduced [(source, gradient)]), in the order of ``sources``."""
        grads = self.gradient(target, sources, output_gradients, use_generic_names)
        pairs = list(zip(sources, grads))
        return [p for p in pairs if var_ref(p[0]) in local], [p for p in pairs if var_ref(p[0]) not in local]

    cls = type(gradtape.__class__.__name__, (gradtape.__class__,),
               {"gradient": gradient, "register_local_source": register_local_source,
                "get_local_and_global_gradients": get_local_and_global_gradients})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    return tape


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                                   sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """``DistributedGradientTape`` whose ``local_layers`` (a Keras layer or a list of them) keep
    their trainable weights' gradients this rank's own."""
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, tf.keras.layers.Layer):
        local_layers = [local_layers]
    elif not all(isinstance(layer, tf.keras.layers.Layer) for layer in local_layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A ``tf.compat.v1`` optimizer whose ``compute_gradients`` averages over the ranks (every
    ``backward_passes_per_step``-th run, the sum of the runs' gradients, in graphs)."""

    def __init__(self, optimizer, name, use_locking, cfg, backward_passes_per_step=1,
                 average_aggregated_gradients=False, scale_local_gradients=True):
        name = name or f"Distributed{type(optimizer).__name__}"
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._average = _averager(cfg)
        self.process_set = cfg[5]
        self.scale_local_gradients = scale_local_gradients
        self._local_vars = set()
        self._agg_helper = None
        if backward_passes_per_step > 1:
            if tf.executing_eagerly():
                raise ValueError("backward_passes_per_step > 1 is not yet supported for _LegacyOptimizer with eager "
                                 "execution.")
            self._agg_helper = LocalGradientAggregationHelper(
                backward_passes_per_step=backward_passes_per_step, allreduce_func=self._average,
                sparse_as_dense=cfg[1], average_aggregated_gradients=average_aggregated_gradients, rank=rank(),
                optimizer_type=LocalGradientAggregationHelper._OPTIMIZER_TYPE_LEGACY, process_set=self.process_set,
                scale_local_gradients=scale_local_gradients, name=name)

    def register_local_var(self, var):
        """This variable's gradient stays this rank's own."""
        if self._agg_helper:
            self._agg_helper.register_local_var(var)
        else:
            self._local_vars.add(var_ref(var))

    @tf.autograph.experimental.do_not_convert
    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if self._agg_helper:
            return list(zip(self._agg_helper.compute_gradients(grads, variables), variables))
        reduced = reduce_except_local(self._average, grads, variables, self._local_vars, self.process_set,
                                      self.scale_local_gradients)
        return list(zip(reduced, variables))

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        if self._agg_helper:
            return self._agg_helper.apply_gradients(
                lambda: self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name),
                self._optimizer, grads_and_vars, global_step=global_step, name=name)
        return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set, scale_local_gradients=True):
    """A ``tf.compat.v1`` optimizer averaging gradients over the ranks before applying them
    (``op=Adasum``: the local updates are combined with Adasum instead, ``adasum_optimizer``)."""
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise ValueError(f"appliance.tensorflow.DistributedOptimizer takes a tf.compat.v1.train.Optimizer, got "
                         f"{type(optimizer).__name__}; Keras optimizers go through horovod.tensorflow.keras")
    if op == Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")
    cfg = _config(compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups, process_set)
    if op == Adasum:
        if process_set.process_set_id != 0:
            raise NotImplementedError("Adasum does not support process sets yet")
        return DistributedAdasumOptimizer(optimizer, name, use_locking, device_dense, device_sparse, compression,
                                          backward_passes_per_step)
    return _DistributedOptimizer(optimizer, name, use_locking, cfg, backward_passes_per_step,
                                 average_aggregated_gradients, scale_local_gradients)
