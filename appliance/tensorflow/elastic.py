"""``horovod.tensorflow.elastic``: Horovod's elastic training API for TensorFlow 2 (eager).

What it is: ``run`` (the decorator), ``TensorFlowState`` (a list of ``tf.Variable``),
``TensorFlowKerasState`` (a Keras model and its optimizer), ``ObjectState``, ``State`` and
``HostUpdateResult``, so that Horovod's elastic TensorFlow 2 scripts run unchanged::

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...  # state.commit() every few batches

    train(state)

Each state keeps a copy of its variables' values at every ``commit`` (``save``), assigns the copy
back on ``restore``, and on ``sync`` broadcasts rank 0's variables (one ``broadcast_variables``
call: every broadcast in flight together) and its extra attributes (``broadcast_object``). The
loop is the framework-free ``appliance.hvdcompat.elastic.run_fn`` (``horovod.common.elastic``),
the one torch's ``hvd.elastic.run`` uses; what is TensorFlow's here is the error mapping: the op
library reports a failed job as ``tf.errors.UnknownError`` (``AbortedError`` when the runtime was
shut down under a pending op) whose message is the core's status line ("peer lost: rank 2
(host): ..."). ``run`` turns such an error, raised by the wrapped function or by a state's
``sync``, into ``HorovodInternalError`` carrying that origin rank and host, so the loop restores
the last commit, re-initialises the runtime for the next round (the surviving processes go on)
and calls the function again. Other TensorFlow errors (a mismatch, a bad dtype, the script's
own) pass through unchanged.

Eager execution only, as Horovod supports elastic TensorFlow 2: a state built in a
``tf.compat.v1`` graph raises ``ValueError`` saying so. Keras 3's optimizer lists its variables in
``optimizer.variables`` (an attribute), tf-keras' older ones return them from ``variables()``:
both are read. An optimizer not built yet (no step taken) is built for the model's trainable
variables before a sync, so a joining worker's variables match rank 0's one for one.

Reads no environment (the runtime's ``init`` does). Failure modes: those of the collectives in
``sync`` and ``commit``; ``HorovodInternalError`` leaves ``run`` only without an elastic launcher
(after the restore), or when the driver ends the job.
"""
from __future__ import annotations

import contextlib
import functools
import re

import tensorflow as tf

from appliance.hvdcompat import elastic as _common
from appliance.hvdcompat.elastic import HostUpdateResult, State  # noqa: F401
from appliance.hvdcompat.exceptions import HorovodInternalError
from appliance.runtime import metrics as _metrics
from appliance.tensorflow.functions import broadcast_object, broadcast_variables
from appliance.tensorflow.mpi_ops import init, rank, shutdown

# The core's status line for a failed job (appliance/runtime/csrc/common/status.cc: code name,
# origin rank and host); mismatch and invalid argument are not job failures. Without an origin rank
# the message must name one of our ops (HorovodAllreduce...), so a script's own "timeout: ..." is not taken.
_FAILED = re.compile(r"\b(peer lost|timeout|protocol error|authentication failed|aborted|internal error|shut down"
                     r"|stalled)(?:: rank (\d+)(?: \(([^)]*)\))?)?(?=: | \[|$)")


def internal_error(error: BaseException) -> HorovodInternalError | None:
    """The ``HorovodInternalError`` a TensorFlow error of the op library stands for, or None
    when ``error`` is not a failed job (another kind of error, or not one of ours)."""
    if not isinstance(error, (tf.errors.UnknownError, tf.errors.AbortedError)):
        return None
    message = getattr(error, "message", "") or str(error)
    matches = list(_FAILED.finditer(message))  # a graph's error also quotes the op's Python source
    found = next((m for m in matches if m.group(2) is not None), matches[0] if matches else None)
    if found is None or (found.group(2) is None and "Horovod" not in message):  # the rank, or one of our ops
        return None
    origin = int(found.group(2)) if found.group(2) is not None else -1
    return HorovodInternalError(message[found.start():].strip(), origin, found.group(3) or "")


@contextlib.contextmanager
def _mapped():
    try:
        yield
    except (tf.errors.UnknownError, tf.errors.AbortedError) as e:
        mapped = internal_error(e)
        if mapped is None:
            raise
        raise mapped from e


def _reset() -> None:
    shutdown()
    init()


def run(func):
    """Decorate ``func(state, *args, **kwargs)`` to run under the elastic loop (module docstring)."""
    @functools.wraps(func)
    def mapped(state, *args, **kwargs):
        with _mapped():
            return func(state, *args, **kwargs)
    return _common.run_fn(mapped, _reset)


def _eager(kind: str) -> None:
    if not tf.executing_eagerly():
        raise ValueError(f"hvd.elastic.{kind} needs eager execution (TensorFlow 2's default); in a tf.compat.v1 "
                         "graph train with a fixed set of ranks")


class ObjectState(_common.ObjectState):
    """Plain picklable objects as attributes, synced from rank 0 with ``hvd.broadcast_object``."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        super().__init__(bcast_object=bcast_object or broadcast_object, get_rank=get_rank or rank, **kwargs)

    def commit(self) -> None:
        _metrics.note_step("commit")  # a step for the metrics, as torch's states count one
        super().commit()


class _VariablesState(ObjectState):
    """Variables (``_variables()``) whose values are saved, restored and broadcast from rank 0,
    and plain attributes as in ``ObjectState``."""

    def _variables(self) -> list:
        raise NotImplementedError

    def _prepare_sync(self) -> None:
        """Make this rank's variables correspond to rank 0's before the broadcast."""

    def _save_variables(self) -> None:
        self._saved_values = [tf.identity(v) for v in self._variables()]

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for var, value in zip(self._variables(), self._saved_values):
            var.assign(value)
        super().restore()

    def sync(self) -> None:
        with _mapped():
            self._prepare_sync()
            variables = self._variables()
            if variables:
                broadcast_variables(variables, root_rank=0)
            self._save_variables()
            super().sync()


class TensorFlowState(_VariablesState):
    """A list of ``tf.Variable`` (``variables``) and any other keyword arguments as attributes.
    ``session`` is accepted for Horovod's signature; a state needs eager execution."""

    def __init__(self, variables=None, session=None, **kwargs):
        _eager("TensorFlowState")
        if variables is None:
            raise ValueError("hvd.elastic.TensorFlowState needs its variables in eager execution: "
                             "TensorFlowState(variables=[...])")
        self.variables = list(variables)
        self.session = session
        self._save_variables()
        super().__init__(**kwargs)

    def _variables(self) -> list:
        return self.variables


def _optimizer_variables(optimizer) -> list:
    found = optimizer.variables
    return list(found() if callable(found) else found)


class TensorFlowKerasState(_VariablesState):
    """A built Keras ``model``, its ``optimizer`` (default ``model.optimizer``) and any other
    keyword arguments as attributes. ``backend`` is accepted for Horovod's signature."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        _eager("TensorFlowKerasState")
        if not getattr(model, "built", True):
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if self.optimizer is None:
            raise ValueError("hvd.elastic.TensorFlowKerasState needs an optimizer: pass optimizer= or compile the "
                             "model with one")
        self.backend = backend
        self._save_variables()
        super().__init__(**kwargs)

    def _variables(self) -> list:
        return list(self.model.variables) + _optimizer_variables(self.optimizer)

    def _prepare_sync(self) -> None:
        if getattr(self.optimizer, "built", True) is False and hasattr(self.optimizer, "build"):
            self.optimizer.build(self.model.trainable_variables)


__all__ = ["HostUpdateResult", "ObjectState", "State", "TensorFlowKerasState", "TensorFlowState", "internal_error",
           "run"]
