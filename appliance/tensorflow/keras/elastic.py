"""``horovod.tensorflow.keras.elastic``: elastic Keras training, Horovod's names over
``appliance.tensorflow.elastic`` (its ``run`` and state classes).

``KerasState`` is a model, its optimizer and any extra attributes (``epoch``, ``batch``...);
``CommitStateCallback`` commits it every ``batches_per_commit`` batches and at each epoch's end;
``UpdateBatchStateCallback`` keeps ``state.batch`` (and, when ``fit`` has ``steps_per_epoch``,
shortens the first epoch after a reset by the batches already done); ``UpdateEpochStateCallback``
keeps ``state.epoch`` counting across resets. Environment: none. Failure modes: as
``appliance.tensorflow.elastic`` (eager only; a failed rank becomes ``HorovodInternalError`` in
``run``, which restores the last commit).
"""
import tensorflow as tf

from appliance.tensorflow.elastic import TensorFlowKerasState, run  # noqa: F401


class KerasState(TensorFlowKerasState):
    """A Keras ``model``, its ``optimizer`` (default: the model's) and ``kwargs`` as attributes."""

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, backend=tf.keras.backend, **kwargs)


class CommitStateCallback(tf.keras.callbacks.Callback):
    """Commits ``state`` every ``batches_per_commit`` batches and at the end of each epoch."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state, self.batches_per_commit = state, batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit  # the same count on every rank after a reset

    def on_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.commit()

    def commit(self):
        self.state.commit()


class UpdateBatchStateCallback(tf.keras.callbacks.Callback):
    """Keeps ``state.batch`` the last finished batch of the epoch (0 after the epoch)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch, logs=None):
        self.state.batch = batch

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
