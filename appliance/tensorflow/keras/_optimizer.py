"""Horovod's Keras ``DistributedOptimizer`` for Keras 3 (TensorFlow's default ``tf.keras``) and for
tf-keras (Keras 2, ``TF_USE_LEGACY_KERAS=1``): the wrapped optimizer's own class, subclassed under
its own name and module, rebuilt from its config, that averages gradients over the ranks.

Where it averages: Keras 3's ``train_step`` hands the gradients to ``optimizer.apply_gradients``,
which calls ``apply``; so on Keras 3 the subclass averages in ``apply`` (everything that updates
variables passes there, ``apply_gradients`` included, once). On tf-keras, as Horovod does, it
averages in ``compute_gradients``/``_compute_gradients``/``get_gradients`` (``minimize``, what
tf-keras's ``train_step`` calls, goes through them). A step's dense gradients go as one grouped
allreduce per dtype (or per ``groups``), so they are negotiated in one round and fuse; an
``IndexedSlices`` gradient goes as two allgathers unless ``sparse_as_dense``.

``backward_passes_per_step`` N > 1: gradients are summed into local accumulators (created once,
outside any ``tf.function``), averaged over N if ``average_aggregated_gradients``, allreduced and
applied every N-th pass; the passes between only count ``iterations``. A rank outside
``process_set`` keeps its own gradients, as Horovod's. Variables are keyed by ``id`` (Keras 3's
variables have no ``ref()``). Keras 3 on ``KERAS_BACKEND=torch`` hands ``apply`` torch tensors:
they are averaged by ``_torch_backend`` (the runtime's numpy API), which refuses what it lacks.
Keras 3 on any other backend (jax, numpy) is refused when the optimizer is made, naming it.

Environment: ``KERAS_BACKEND`` (Keras's). Failure modes: ``NotImplementedError`` naming a Keras 3
backend other than tensorflow and torch; collectives fail as ``appliance.tensorflow.mpi_ops`` says; a
Keras 3 step compiled with XLA (``jit_compile``, Keras 3's default where a GPU is visible) raises
ValueError naming ``jit_compile=False`` when traced (the op library has no XLA kernels);
ranks must call the optimizer on the same variables in the same order (the group's name in a
graph is derived from its tensors' names).
"""
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from appliance.tensorflow.keras import _torch_backend
from appliance.tensorflow.mpi_ops import Average
from appliance.tensorflow.optimizer import split_list

# Traced as written (explicit tf.cond): AutoGraph converting these, and all they call, inside
# Keras's train function only costs time.
_plain = tf.autograph.experimental.do_not_convert

XLA_REFUSED = ("horovod.tensorflow.keras: the model's step is compiled with XLA, which cannot run the collective ops: "
               "compile the model with jit_compile=False (Keras 3 turns XLA on by default where a GPU is visible)")


def is_keras3(obj) -> bool:
    """Whether ``obj`` (an optimizer, layer or model) is Keras 3's (module ``keras.``), not tf-keras's."""
    return any(c.__module__.startswith("keras.") for c in type(obj).__mro__)



class Reducer:
    """Averages (or sums) a list of gradients over the ranks of a process set; ``None`` stays."""

    def __init__(self, compression, sparse_as_dense, op, gradient_predivide_factor, groups, process_set):
        self.compression, self.sparse_as_dense, self.op = compression, sparse_as_dense, op
        self.groups, self.process_set = groups, process_set
        f = float(gradient_predivide_factor)
        self.pre, self.post = (1.0 / f, f) if op == Average else (1.0, 1.0)
        self.local_ids: set = set()
        self.scale_local = True

    def _bundles(self, dense: list, variables: list) -> list:
        if not self.groups:
            return [dense] if dense else []
        if isinstance(self.groups, int):
            return split_list(dense, self.groups)
        where = {id(variables[i]): i for i in dense}
        taken, bundles = set(), []
        for group in self.groups:
            b = [where[id(v)] for v in group if id(v) in where]
            taken.update(b)
            if b:
                bundles.append(b)
        return bundles + [[i] for i in dense if i not in taken]

    @_plain
    def reduce(self, grads, variables) -> list:
        from appliance.tensorflow import allreduce, grouped_allreduce  # the package's (IndexedSlices)

        grads, variables = list(grads), list(variables)
        if self.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        out = list(grads)
        if not self.process_set.included():
            return out
        todo = [i for i, g in enumerate(grads) if g is not None and id(variables[i]) not in self.local_ids]
        dense = [i for i in todo if not isinstance(grads[i], tf.IndexedSlices)]
        for i in todo:
            if isinstance(grads[i], tf.IndexedSlices):
                out[i] = allreduce(grads[i], op=self.op, process_set=self.process_set)
        kw = dict(compression=self.compression, op=self.op, prescale_factor=self.pre, postscale_factor=self.post,
                  process_set=self.process_set)
        for bundle in self._bundles(dense, variables):
            for dtype in sorted({grads[i].dtype for i in bundle}, key=lambda d: d.name):
                idx = [i for i in bundle if grads[i].dtype == dtype]
                for i, r in zip(idx, grouped_allreduce([grads[i] for i in idx], **kw)):
                    out[i] = r
        if self.scale_local and self.local_ids:  # Horovod divides a local gradient by the set's size
            n = self.process_set.size()
            for i, g in enumerate(out):
                if g is not None and id(variables[i]) in self.local_ids:
                    out[i] = (tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                              if isinstance(g, tf.IndexedSlices) else g / n)
        return out


class Aggregator:
    """Local gradient accumulation over ``n`` backward passes (``counter`` counts them, 0..n)."""

    def __init__(self, n: int, average: bool):
        self.n, self.average = n, average
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="hvd_aggregation_counter")
        self._acc: dict = {}

    def _slot(self, variable, grad):
        key = id(variable)
        if key not in self._acc:
            with tf.init_scope():
                self._acc[key] = tf.Variable(tf.zeros(variable.shape, grad.dtype), trainable=False,
                                             name="hvd_aggregated_gradient")
        return self._acc[key]

    @_plain
    def accumulate(self, grads, variables) -> None:
        self.counter.assign_add(1)
        for g, v in zip(grads, variables):
            if g is not None:
                self._slot(v, g).assign_add(tf.convert_to_tensor(g))

    def ready(self):
        return tf.equal(self.counter, self.n)

    def values(self, grads, variables) -> list:
        out = []
        for g, v in zip(grads, variables):
            if g is None:
                out.append(None)
                continue
            acc = self._slot(v, g).read_value()
            out.append(acc / self.n if self.average else acc)
        return out

    def reset(self) -> None:
        self.counter.assign(0)
        for acc in self._acc.values():
            acc.assign(tf.zeros_like(acc))

    def register_local_var(self, var) -> None:  # Horovod's helper has it; the Reducer holds the set
        pass


def _setup(opt, reducer: Reducer, n: int, average: bool, name) -> None:
    opt._hvd_reducer = reducer
    opt._agg_helper = Aggregator(n, average) if n > 1 else None
    opt._hvd_name = name or "Distributed%s" % type(opt).__base__.__name__
    opt.process_set = reducer.process_set


def _register_local_var(self, var):
    """This variable's gradient stays this rank's own (divided by the set's size, as Horovod)."""
    self._hvd_reducer.local_ids.add(id(var))


def _torch_check(reducer, agg) -> None:
    """What the torch backend's path (``_torch_backend``) does not do, refused by name."""
    from appliance.tensorflow import Compression, global_process_set

    for what, unsupported in (("backward_passes_per_step > 1", agg is not None),
                              ("compression", reducer.compression is not Compression.none),
                              ("groups", bool(reducer.groups)),
                              ("a process set other than the global one", reducer.process_set is not global_process_set)):
        if unsupported:
            _torch_backend.refuse(what)


KERAS3_BACKENDS = ("tensorflow", "torch")


def check_backend(backend: str) -> None:
    """NotImplementedError naming a Keras 3 backend whose gradients reach neither TensorFlow's ops
    nor the runtime's numpy path (``_torch_backend``)."""
    if backend not in KERAS3_BACKENDS:
        raise NotImplementedError(f"horovod.keras on KERAS_BACKEND={backend}: not supported; its gradients are "
                                  f"averaged on the {' and '.join(KERAS3_BACKENDS)} backends only")


def _keras3_class(base, make):
    class _Distributed(base):
        _hvd_distributed = True

        def __init__(self, *args, **kwargs):
            import keras

            check_backend(keras.backend.backend())
            super().__init__(*args, **kwargs)
            make(self)

        register_local_var = _register_local_var

        @_plain
        def apply(self, grads, trainable_variables=None):
            grads = list(grads)
            if not grads:
                return super().apply(grads, trainable_variables)
            variables = list(trainable_variables) if trainable_variables is not None else list(
                self._trainable_variables)
            if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
                raise ValueError(XLA_REFUSED)
            reducer, agg = self._hvd_reducer, self._agg_helper
            if _torch_backend.active(self):
                _torch_check(reducer, agg)
                return super().apply(_torch_backend.reduce(grads, variables, reducer), variables)
            if agg is None:
                return super().apply(reducer.reduce(grads, variables), variables)
            if not self.built:
                self.build(variables)
                self.built = True
            base_apply = super().apply
            agg.accumulate(grads, variables)

            def boundary():
                base_apply(reducer.reduce(agg.values(grads, variables), variables), variables)
                agg.reset()

            def between():
                self.iterations.assign_add(1)

            tf.cond(agg.ready(), boundary, between)

    return _Distributed


def _keras2_class(base, make):
    class _Distributed(base):
        _HAS_AGGREGATE_GRAD = True
        _hvd_distributed = True

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            make(self)

        register_local_var = _register_local_var

        def compute_gradients(self, loss, var_list, tape=None):
            return self._compute_gradients(loss, var_list, None, tape)

        @_plain
        def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
            parent = super()
            tape = tf.GradientTape() if tape is None else tape
            if hasattr(parent, "_compute_gradients"):
                pairs = parent._compute_gradients(loss, var_list, grad_loss, tape=tape)
            else:
                pairs = parent.compute_gradients(loss, var_list, tape=tape)
            grads, variables = zip(*pairs)
            return list(zip(self._allreduce(grads, variables), variables))

        @_plain
        def get_gradients(self, loss, params):
            return self._allreduce(super().get_gradients(loss, params), params)

        @_plain
        def _allreduce(self, grads, variables):
            grads, variables = list(grads), list(variables)
            reducer, agg = self._hvd_reducer, self._agg_helper
            if agg is None:
                return reducer.reduce(grads, variables)
            agg.accumulate(grads, variables)
            present = [i for i, g in enumerate(grads) if g is not None]
            local = [g for g in agg.values(grads, variables) if g is not None]
            pv = [variables[i] for i in present]
            reduced = tf.cond(agg.ready(), lambda: [tf.convert_to_tensor(g) for g in reducer.reduce(local, pv)],
                              lambda: local) if local else []
            out = list(grads)
            for i, r in zip(present, reduced):
                out[i] = r
            return out

        @_plain
        def apply_gradients(self, *args, **kwargs):
            agg = self._agg_helper
            if agg is None:
                return super().apply_gradients(*args, **kwargs)
            args = (list(args[0]),) + tuple(args[1:])
            base_apply = super().apply_gradients

            def boundary():
                with tf.control_dependencies([base_apply(*args, **kwargs)]):
                    agg.reset()
                return tf.constant(True)

            def between():
                self.iterations.assign_add(1)
                return tf.constant(False)

            return tf.cond(agg.ready(), boundary, between)

    return _Distributed


def create_distributed_optimizer(optimizer, name, compression, sparse_as_dense, gradient_predivide_factor, op,
                                 backward_passes_per_step, average_aggregated_gradients, groups, process_set,
                                 scale_local_gradients):
    """A new optimizer of ``optimizer``'s class (under its name and module, so a saved model
    loads without Horovod) from ``optimizer``'s config, averaging gradients over the ranks."""
    def make(opt):
        reducer = Reducer(compression, sparse_as_dense, op, gradient_predivide_factor, groups, process_set)
        reducer.scale_local = scale_local_gradients
        _setup(opt, reducer, int(backward_passes_per_step), bool(average_aggregated_gradients), name)

    base = type(optimizer)
    cls = (_keras3_class if is_keras3(optimizer) else _keras2_class)(base, make)
    cls.__name__ = cls.__qualname__ = base.__name__
    cls.__module__ = base.__module__
    return cls.from_config(optimizer.get_config())
