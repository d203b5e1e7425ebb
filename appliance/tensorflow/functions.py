"""Broadcasting variables from a root rank: ``broadcast_variables`` (eager, ``tf.function`` and
v1 graphs), ``broadcast_`` (Horovod's in-place form, eager), ``broadcast_object`` and
``allgather_object`` (picklable objects, eager), ``broadcast_global_variables`` and ``BroadcastGlobalVariablesHook`` (v1 sessions).
Eagerly, the broadcasts of one call run inside one ``tf.function``, so they are in flight
together. Failure modes: as ``mpi_ops.broadcast``."""
import io
import pickle

import numpy as np
import tensorflow as tf

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
    values. Done as assignments of broadcast values (one copy more than an in-place kernel), in
    one tf.function eagerly, so the broadcasts are in flight together."""
    variables = list(variables)
    broadcast_variables(variables, root_rank, process_set=process_set)
    if not tf.executing_eagerly():
        raise NotImplementedError("broadcast_ in a tf.compat.v1 graph: use hvd.broadcast_variables (an op)")
    return [v.read_value() for v in variables]


def _dumps(obj) -> tf.Tensor:
    buf = io.BytesIO()
    pickle.dump(obj, buf)
    return tf.constant(np.frombuffer(buf.getvalue(), dtype=np.uint8))


def _loads(t) -> object:
    return pickle.loads(t.numpy().tobytes())


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Root's ``obj`` (anything picklable) on every rank of ``process_set`` (eagerly; ranks may
    pass objects of different types)."""
    if not tf.executing_eagerly():
        raise NotImplementedError("broadcast_object in a tf.compat.v1 graph is not supported by appliance.tensorflow yet")
    if rank() == root_rank:
        payload = _dumps(obj)
        broadcast(tf.constant([int(payload.shape[0])], tf.int64), root_rank, process_set=process_set)
        broadcast(payload, root_rank, process_set=process_set)
        return obj
    n = int(broadcast(tf.zeros([1], tf.int64), root_rank, process_set=process_set)[0])
    return _loads(broadcast(tf.zeros([n], tf.uint8), root_rank, process_set=process_set))


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Every rank's ``obj`` (anything picklable), as a list in rank order (eagerly)."""
    if not tf.executing_eagerly():
        raise NotImplementedError("allgather_object in a tf.compat.v1 graph is not supported by appliance.tensorflow yet")
    payload = _dumps(obj)
    lengths = allgather(tf.constant([int(payload.shape[0])], tf.int64), process_set=process_set).numpy().tolist()
    gathered = allgather(payload, process_set=process_set)
    out, start = [], 0
    for n in lengths:
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
