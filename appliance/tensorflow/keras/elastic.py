"""``horovod.tensorflow.keras.elastic``: elastic Keras training, Horovod's names over
``appliance.tensorflow.elastic`` (its ``run`` and state classes).

``KerasState`` is a model, its optimizer and any extra attributes (``epoch``, ``batch``...);
``CommitStateCallback`` commits it every ``batches_per_commit`` batches and after each epoch,
once the other callbacks have updated it (as the next batch or epoch begins, or ``fit`` ends);
``UpdateBatchStateCallback`` keeps ``state.batch``, the batches done in the epoch (and, when
``fit`` has ``steps_per_epoch``, shortens the first epoch after a reset by them, through what
``fit`` reads the epoch's length from, found on its frame: Keras 3's epoch iterator, tf-keras's
data handler); ``UpdateEpochStateCallback`` keeps
``state.epoch`` counting across resets. Environment: none. Failure modes: as
``appliance.tensorflow.elastic`` (eager only; a failed rank becomes ``HorovodInternalError`` in
``run``, which restores the last commit); a trainer whose ``fit`` holds neither runs the
first epoch after a reset whole (its data runs past the epoch).
"""
import sys

import tensorflow as tf

from appliance.tensorflow.elastic import TensorFlowKerasState, run  # noqa: F401


class KerasState(TensorFlowKerasState):
    """A Keras ``model``, its ``optimizer`` (default: the model's) and ``kwargs`` as attributes."""

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, backend=tf.keras.backend, **kwargs)


class CommitStateCallback(tf.keras.callbacks.Callback):
    """Commits ``state`` every ``batches_per_commit`` batches and after each epoch.

    The commit is taken as the next batch or epoch begins (or ``fit`` ends), once every callback's
    ``on_*_end`` has run: placed before the Update callbacks (Horovod's example lists it first), a
    commit at ``on_batch_end`` would hold the new weights with the old counters."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state, self.batches_per_commit = state, batches_per_commit
        self.batches_remaining = batches_per_commit
        self._due = False

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit  # the same count on every rank after a reset
        self._due = False

    def on_train_batch_begin(self, batch, logs=None):
        self._commit_due()

    def on_epoch_begin(self, epoch, logs=None):
        self._commit_due()

    def on_train_end(self, logs=None):
        self._commit_due()

    def on_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self._due = True
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self._due = True

    def _commit_due(self):
        if self._due:
            self._due = False
            self.commit()

    def commit(self):
        self.state.commit()


def _set_epoch_steps(steps: int) -> bool:
    """Sets the number of batches the epoch that is beginning runs, where ``fit`` reads it: Keras 3
    from its local epoch iterator (``steps_per_epoch``), tf-keras from its local data handler
    (``_inferred_steps``); ``params`` is only the callbacks' copy. Both found on ``fit``'s frame;
    False when neither is (another trainer)."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        local = frame.f_locals
        iterator, handler = local.get("epoch_iterator"), local.get("data_handler")
        if iterator is not None and getattr(iterator, "steps_per_epoch", None):
            iterator.steps_per_epoch = steps
            return True
        if handler is not None and getattr(handler, "_inferred_steps", None):
            handler._inferred_steps = steps
            return True
        frame = frame.f_back
    return False


class UpdateBatchStateCallback(tf.keras.callbacks.Callback):
    """Keeps ``state.batch`` the number of batches done in the current epoch (0 after the epoch).
    With ``steps_per_epoch`` in ``fit``, the first epoch after a reset runs only the batches left
    of it, on Keras 3 (its epoch iterator) as on tf-keras (its data handler)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None
        self._done_before = 0

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self._done_before = self.state.batch  # Keras numbers this epoch's batches from 0
        if not self.params.get("steps"):
            return
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.params.get("steps")
        steps = self.steps_per_epoch - self.state.batch
        self.params["steps"] = steps
        _set_epoch_steps(steps)

    def on_batch_end(self, batch, logs=None):
        self.state.batch = self._done_before + batch + 1  # batch: the last one of a steps_per_execution run

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(tf.keras.callbacks.Callback):
    """Keeps ``state.epoch`` the number of finished epochs, across resets (Keras counts from 0
    in every ``fit``)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
