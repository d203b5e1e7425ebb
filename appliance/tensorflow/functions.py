"""Broadcasting variables from a root rank: ``broadcast_variables`` and ``broadcast_`` (Horovod's
in-place form) eagerly, in ``tf.function`` and in v1 graphs; ``broadcast_object``,
``broadcast_object_fn`` and ``allgather_object`` (picklable objects, pickled with cloudpickle
when it is importable, eagerly or run by a v1 session); ``broadcast_global_variables`` and
``BroadcastGlobalVariablesHook`` (v1 sessions). Eagerly, the broadcasts of one call run inside
one ``tf.function``, so they are in flight together. Failure modes: as ``mpi_ops.broadcast``;
the object helpers in a v1 graph without a session raise ValueError saying so; ``broadcast_``
of resource and reference variables mixed raises ValueError, as Horovod's."""
import io

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

try:  # Horovod's pickler: lambdas and local classes too
    import cloudpickle as _pickle
except ImportError:  # pragma: no cover - cloudpickle is optional, as for appliance.torch
    import pickle as _pickle

from appliance.runtime import process_sets as _ps
from appliance.tensorflow.mpi_ops import allgather, broadcast, global_process_set, rank

_groups: dict = {}  # (root_rank, process set id) -> tf.function broadcasting a list of variables


def _assign_all(variables, root_rank, process_set):
    return tf.group(*[v.assign(broadcast(v, root_rank, process_set=process_set)) for v in variables])


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assign every variable root_rank's value. Returns the op that does it in a graph (None
    eagerly, where it is done on return)."""
    variables = list(variables)
    if not tf.executing_eagerly():
        return _assign_all(variables, root_rank, process_set)
    # a Keras 3 variable passed to a tf.function becomes a read-only tensor: pass the tf.Variable it wraps
    variables = [v.value if not isinstance(v, tf.Variable) and isinstance(getattr(v, "value", None), tf.Variable)
                 else v for v in variables]
    key = (root_rank, _ps.resolve(process_set))
    fn = _groups.get(key)
    if fn is None:
        def assign(vs):
            _assign_all(vs, root_rank, process_set)  # a tf.function returns no Operation

        fn = _groups[key] = tf.function(assign)
    fn(variables)
    return None


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Horovod's in-place broadcast: every variable takes root_rank's value; returns their new
    values (in a graph: tensors that read them after the broadcast). Done as assignments of
    broadcast values (one copy more than an in-place kernel); eagerly in one tf.function, so the
    broadcasts are in flight together. Resource and reference (v1) variables alike, not mixed."""
    variables = list(variables)
    kinds = {resource_variable_ops.is_resource_variable(v) for v in variables}
    if len(kinds) > 1:
        raise ValueError("All variables passed to broadcast_() should be of the same kind, resource or reference")
    if tf.executing_eagerly():
        broadcast_variables(variables, root_rank, process_set=process_set)
        return [v.read_value() for v in variables]
    with tf.control_dependencies([_assign_all(variables, root_rank, process_set)]):
        return [v.read_value() for v in variables]


def _dumps(obj) -> np.ndarray:
    buf = io.BytesIO()
    _pickle.dump(obj, buf)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


def _loads(array) -> object:
    return _pickle.loads(np.asarray(array).tobytes())


def _runner(session):
    """A function giving a tensor's value: eagerly its numpy; in a graph, run by ``session`` (or
    the default session)."""
    if tf.executing_eagerly():
        return lambda t, feed=None: t.numpy()
    sess = session or tf.compat.v1.get_default_session()
    if sess is None:
        raise ValueError("in a tf.compat.v1 graph, pass session= or call this inside a default session "
                         "(with tf.compat.v1.Session() as sess:)")
    return lambda t, feed=None: sess.run(t, feed_dict=feed)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Root's ``obj`` (anything picklable) on every rank of ``process_set``: eagerly, or in a
    ``tf.compat.v1`` graph run by ``session`` (default: the default session). Ranks may pass
    objects of different types (the default name does not depend on it)."""
    value = _runner(session)
    name = name or "broadcast_object"
    if rank() == root_rank:
        payload = _dumps(obj)
        value(broadcast(tf.constant([payload.size], tf.int64), root_rank, name + ".sz", process_set=process_set))
        value(broadcast(tf.constant(payload), root_rank, name + ".t", process_set=process_set))
        return obj
    n = int(value(broadcast(tf.zeros([1], tf.int64), root_rank, name + ".sz", process_set=process_set))[0])
    return _loads(value(broadcast(tf.zeros([n], tf.uint8), root_rank, name + ".t", process_set=process_set)))


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function ``f(obj)`` returning root's ``obj`` on every rank, each call. In a
    ``tf.compat.v1`` graph its two broadcasts (length, then bytes) are built once, fed through
    placeholders and run by ``session`` (default: the default session at each call); eagerly
    it is ``broadcast_object``."""
    name = name or "broadcast_object_fn"
    if tf.executing_eagerly():
        return lambda obj: broadcast_object(obj, root_rank, name=name, process_set=process_set)
    size_in = tf.compat.v1.placeholder(tf.int64, [1], name="bcast_object_size")
    size_out = broadcast(size_in, root_rank, name + ".sz", process_set=process_set)
    data_in = tf.compat.v1.placeholder(tf.uint8, [None], name="bcast_object_data")
    data_out = broadcast(data_in, root_rank, name + ".t", process_set=process_set)

    def bcast(obj):
        run = _runner(session)
        if rank() == root_rank:
            payload = _dumps(obj)
            run(size_out, {size_in: [payload.size]})
            run(data_out, {data_in: payload})
            return obj
        n = int(run(size_out, {size_in: [0]})[0])
        return _loads(run(data_out, {data_in: np.zeros([n], np.uint8)}))

    return bcast


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Every rank's ``obj`` (anything picklable), as a list in the set's rank order: eagerly, or
    in a ``tf.compat.v1`` graph run by ``session`` (default: the default session)."""
    value = _runner(session)
    name = name or "allgather_object"
    payload = _dumps(obj)
    lengths = value(allgather(tf.constant([payload.size], tf.int64), name=name + ".sz", process_set=process_set))
    gathered = value(allgather(tf.constant(payload), name=name + ".t", process_set=process_set))
    out, start = [], 0
    for n in lengths.tolist():
        out.append(_loads(gathered[start:start + n]))
        start += n
    return out


def broadcast_global_variables(root_rank):
    """The op broadcasting every global variable of a v1 graph from ``root_rank``."""
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. "
                           "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A v1 session hook that broadcasts every global variable from ``root_rank`` once the session
    is created (a checkpoint restored, or fresh initial values)."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.bcast_op = None

    def begin(self):
        if not self.bcast_op or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            with tf.device(self.device):
                self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)
