"""``horovod.tensorflow.keras`` and ``horovod.keras``: Horovod's Keras API over the appliance's
runtime, for Keras 3 (TensorFlow's default ``tf.keras``) and tf-keras (``TF_USE_LEGACY_KERAS=1``).

What it owns: the Keras face of ``appliance.tensorflow`` with Horovod 0.28.1's names and defaults
(the union of its two Keras modules): the basics, ``Average``/``Sum``/``Adasum``, process sets,
``DistributedOptimizer`` and ``PartialDistributedOptimizer`` (``_optimizer``: the gradients are
averaged where each Keras applies them), ``broadcast_global_variables``, ``allreduce``,
``allgather``, ``broadcast``, ``reducescatter`` on values (eager: numpy in, tensors out),
``load_model`` (a saved model's optimizer comes back wrapped), ``Compression``, ``callbacks`` and
``elastic``.
Which Keras: ``tf.keras`` as TensorFlow resolves it (``TF_USE_LEGACY_KERAS=1``: tf-keras); an
optimizer is handled as the Keras it belongs to.

One copy: ``horovod.tensorflow`` is ``appliance.tensorflow``, so ``import horovod.tensorflow.keras``
finds this file through that package's path and runs it under the ``horovod.`` name; the start of
this file then puts the one ``appliance.tensorflow.keras`` module (and its ``callbacks`` and
``elastic``) in its place. ``horovod.keras`` (shim) is this module too.

Environment: ``TF_USE_LEGACY_KERAS`` (TensorFlow's: which Keras ``tf.keras`` is). Failure modes:
``op`` other than Average/Sum and bad ``groups`` raise ``ValueError`` as Horovod's; collectives
fail as ``appliance.tensorflow`` says; ``broadcast_global_variables`` eagerly raises RuntimeError
(use ``BroadcastGlobalVariablesCallback``), as Horovod's.
"""
import sys
import warnings

if __name__ != "appliance.tensorflow.keras":  # reached as horovod.tensorflow.keras: serve the one copy
    import importlib

    _one = importlib.import_module("appliance.tensorflow.keras")
    sys.modules[__name__] = _one
    sys.modules[__name__ + ".callbacks"] = _one.callbacks
    sys.modules[__name__ + ".elastic"] = _one.elastic
else:
    import tensorflow as tf

    import appliance.tensorflow as hvd
    from appliance.tensorflow import (  # noqa: F401
        Adasum, Average, Compression, ProcessSet, Sum, add_process_set, ccl_built, cross_rank, cross_size,
        cuda_built, ddl_built, global_process_set, gloo_built, gloo_enabled, init, is_homogeneous,
        is_initialized, local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
        remove_process_set, rocm_built, shutdown, size, start_timeline, stop_timeline,
    )
    from appliance.tensorflow.keras import _optimizer
    from appliance.tensorflow.keras import callbacks, elastic  # noqa: F401

    def _check(op, gradient_predivide_factor, num_groups, groups):
        if op != Average and op != Sum:
            raise ValueError("op currently only supports Average and Sum")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if num_groups != 0:
            warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                          DeprecationWarning)
            if groups is None:
                groups = num_groups
        if groups is not None and not (isinstance(groups, list) or groups > 0):
            raise ValueError("groups should be a non-negative integer or a list of list of tf.Variable.")
        return groups

    def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                             sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                             backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0,
                             groups=None, process_set=global_process_set, scale_local_gradients=True):
        """``optimizer`` (a Keras 3 or tf-keras optimizer) averaging its gradients over the ranks of
        ``process_set`` before applying them; a new optimizer of the same class and config."""
        groups = _check(op, gradient_predivide_factor, num_groups, groups)
        return _optimizer.create_distributed_optimizer(
            optimizer, name, compression, sparse_as_dense, gradient_predivide_factor, op, backward_passes_per_step,
            average_aggregated_gradients, groups, process_set, scale_local_gradients)

    def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                    compression=Compression.none, sparse_as_dense=False,
                                    gradient_predivide_factor=1.0, op=Average, groups=None,
                                    process_set=global_process_set, local_layers=None, scale_local_gradients=True):
        """``DistributedOptimizer`` whose ``local_layers``' gradients stay each rank's own."""
        if local_layers is None:
            local_layers = []
        elif not isinstance(local_layers, (list, tuple)):
            local_layers = [local_layers]
        if not all(hasattr(layer, "trainable_weights") for layer in local_layers):
            raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
        opt = DistributedOptimizer(optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
                                   gradient_predivide_factor=gradient_predivide_factor, op=op, groups=groups,
                                   process_set=process_set, scale_local_gradients=scale_local_gradients)
        for layer in local_layers:
            for var in layer.trainable_weights:
                opt.register_local_var(var)
        return opt

    def broadcast_global_variables(root_rank):
        """The v1 graph's global variables from ``root_rank`` (eagerly: RuntimeError, as Horovod)."""
        return hvd.broadcast_global_variables(root_rank)

    def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
                  compression=Compression.none):
        """``value`` (anything ``tf.constant`` takes) reduced over the ranks (Average by default)."""
        return hvd.allreduce(tf.constant(value, name=name), average=average, prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor, op=op, compression=compression)

    def allgather(value, name=None):
        """The ranks' values concatenated along the first dimension."""
        return hvd.allgather(tf.constant(value, name=name))

    def broadcast(value, root_rank, name=None):
        """``root_rank``'s value on every rank."""
        return hvd.broadcast(tf.constant(value, name=name), root_rank)

    def reducescatter(value, name=None, op=Average):
        """This rank's share of ``value`` reduced over the ranks."""
        return hvd.reducescatter(tf.constant(value, name=name), op=op)

    def _loader(cls, compression):
        """A stand-in for ``cls`` when deserializing: builds ``cls`` from its config, wrapped."""
        def from_config(_, config, custom_objects=None):
            return DistributedOptimizer(cls.from_config(config), compression=compression)

        return type(cls.__name__, (), {"from_config": classmethod(from_config),
                                       "__new__": lambda c, **kw: from_config(c, kw)})

    def _subclasses(root) -> list:
        out, todo = [], [root]
        while todo:
            for sub in todo.pop().__subclasses__():
                if sub not in out and "_hvd_distributed" not in sub.__dict__:
                    out.append(sub)
                    todo.append(sub)
        return out

    def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none,
                   legacy_opts=False):
        """A saved Keras model whose optimizer (any of Keras's own, or ``custom_optimizers``) is
        wrapped in ``DistributedOptimizer`` with its saved state."""
        keras = tf.keras
        root = keras.optimizers.legacy.Optimizer if legacy_opts else keras.optimizers.Optimizer
        objects = {}
        for cls in _subclasses(root) + list(custom_optimizers or []):
            objects[cls.__name__] = objects[cls.__name__.lower()] = _loader(cls, compression)
        objects.update(custom_objects or {})
        return keras.models.load_model(filepath, custom_objects=objects)

    del sys
