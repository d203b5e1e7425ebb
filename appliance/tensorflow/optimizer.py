"""Averaging gradients over the ranks: ``DistributedGradientTape`` (TensorFlow 2) and
``DistributedOptimizer`` (``tf.compat.v1`` optimizers), with Horovod's arguments and defaults.

Eagerly, one step's allreduces run inside one ``tf.function`` (built once per tape or optimizer
configuration), so they are all in flight together and the runtime fuses them; in a graph they
are graph ops already. ``gradient_predivide_factor`` splits Average's division into a prescale
of 1/f and a postscale of f (the core divides by the size too). ``sparse_as_dense`` turns
``IndexedSlices`` into dense tensors first; otherwise they go as two allgathers.
``num_groups``/``groups`` bundle gradients into grouped allreduces.

Failure modes: Keras optimizers (``tf.keras.optimizers``) are refused with a ValueError (their
``apply_gradients`` path is Keras's: horovod.tensorflow.keras); collectives fail as
``mpi_ops`` says.
"""
import tensorflow as tf

from appliance.tensorflow.compression import Compression
from appliance.tensorflow.mpi_ops import Adasum, Average, global_process_set

_functions: dict = {}  # configuration -> tf.function averaging a list of gradients


def _split(items: list, n: int) -> list:
    """``items`` in ``n`` consecutive groups as even as possible (Horovod's split_list)."""
    d, r = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + d + (1 if i < r else 0)
        if end > start:
            out.append(items[start:end])
        start = end
    return out


def _allreduce_grads(grads, variables, cfg):
    """The averaged gradients (None stays None), as ``cfg`` says."""
    from appliance.tensorflow import allreduce, grouped_allreduce  # the package's, with IndexedSlices

    compression, sparse_as_dense, op, predivide, groups, process_set = cfg
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
        bundles = _split(present, groups)
    else:  # lists of variables: their gradients go together, the rest one by one
        index = {v.ref(): i for i, v in enumerate(variables)}
        taken, bundles = set(), []
        for group in groups:
            b = [(index[v.ref()], grads[index[v.ref()]]) for v in group
                 if v.ref() in index and grads[index[v.ref()]] is not None]
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
            tuple(tuple(v.ref() for v in g) for g in cfg[4]), tuple(v.ref() for v in variables))
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
    if op == Adasum:
        raise NotImplementedError("Adasum through DistributedGradientTape/DistributedOptimizer is not supported by "
                                  "appliance.tensorflow yet")
    if groups is not None and num_groups:
        raise ValueError("Please set either num_groups or groups, not both")
    if groups is not None and not (isinstance(groups, list) and all(isinstance(g, list) for g in groups)):
        raise ValueError("groups should be a list of lists of tf.Variable")
    return (compression, bool(sparse_as_dense), op, float(gradient_predivide_factor),
            groups if groups is not None else int(num_groups or 0), process_set)


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=global_process_set, scale_local_gradients=True):
    """``gradtape`` whose ``gradient()`` returns the gradients averaged over the ranks (an
    instance of a subclass of the tape's own class, holding the recorded tape)."""
    average = _averager(_config(compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups,
                                process_set))
    local = set()

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False):
        grads = super(cls, self).gradient(target, sources, output_gradients)
        flat_sources, flat_grads = tf.nest.flatten(sources), tf.nest.flatten(grads, expand_composites=False)
        todo = [i for i, s in enumerate(flat_sources) if s.ref() not in local]
        reduced = average([flat_grads[i] for i in todo], [flat_sources[i] for i in todo])
        for i, r in zip(todo, reduced):
            flat_grads[i] = r
        return tf.nest.pack_sequence_as(grads, flat_grads)

    def register_local_source(self, source):
        """This variable's gradient stays this rank's own."""
        local.add(source.ref())

    cls = type(gradtape.__class__.__name__, (gradtape.__class__,),
               {"gradient": gradient, "register_local_source": register_local_source})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    return tape


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A ``tf.compat.v1`` optimizer whose ``compute_gradients`` averages over the ranks."""

    def __init__(self, optimizer, name, use_locking, cfg):
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer = optimizer
        self._average = _averager(cfg)

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        return list(zip(self._average(grads, variables), variables))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set):
    """A ``tf.compat.v1`` optimizer averaging gradients over the ranks before applying them."""
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise ValueError(f"appliance.tensorflow.DistributedOptimizer takes a tf.compat.v1.train.Optimizer, got "
                         f"{type(optimizer).__name__}; Keras optimizers go through horovod.tensorflow.keras")
    if backward_passes_per_step != 1:
        raise NotImplementedError("backward_passes_per_step > 1 is not supported by appliance.tensorflow yet")
    return _DistributedOptimizer(optimizer, name, use_locking,
                                 _config(compression, sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                         groups, process_set))
