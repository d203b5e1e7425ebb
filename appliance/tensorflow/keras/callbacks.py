"""Horovod's Keras callbacks (``horovod.tensorflow.keras.callbacks``) for Keras 3 and tf-keras:
``BroadcastGlobalVariablesCallback``, ``MetricAverageCallback``, ``LearningRateScheduleCallback``,
``LearningRateWarmupCallback`` and ``BestModelCheckpoint``, subclasses of ``tf.keras``'s
``Callback`` (whichever Keras ``TF_USE_LEGACY_KERAS`` selects).

Differences that Keras 3 forces, with Horovod's schedule kept: the learning rate is read and set
through ``optimizer.learning_rate`` (Keras 3 has no ``lr``); momentum correction, which Horovod
does by scaling ``momentum`` for one batch, scales SGD's velocity variables by new_lr / old_lr
instead on Keras 3 (the same update: Keras 3 traces ``momentum`` into the step as a Python
number, so changing it would not reach the step); the broadcast runs when training begins, so the first step
starts from root's weights (Keras 3 builds its optimizer first), and on tf-keras again after the
first batch, as Horovod's (tf-keras creates its optimizer's variables in the first step).
``BestModelCheckpoint`` writes on rank 0 only. On Keras 3's torch backend the broadcast assigns
the root's values through ``_torch_backend`` (the variables hold torch tensors).

Environment: none. Failure modes: collectives fail as ``appliance.tensorflow`` says; a schedule
that cannot find the steps per epoch raises ValueError, as Horovod's.
"""
import numpy as np
import tensorflow as tf

import appliance.tensorflow as hvd
from appliance.tensorflow.keras import _torch_backend
from appliance.tensorflow.keras._optimizer import is_keras3

keras = tf.keras


def _value(x) -> float:
    return float(np.asarray(x.numpy() if hasattr(x, "numpy") else x))


def _tf_variables(variables) -> list:
    """Keras 3 variables as the tf.Variables beneath them (tf.Variables as they are)."""
    return [v if isinstance(v, tf.Variable) else v.value for v in variables]


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcasts the model's and its optimizer's variables from ``root_rank`` once, so every rank
    starts from the same state (fresh or restored); ``local_variables`` are left alone."""

    def __init__(self, root_rank, device="", local_variables=None):
        super().__init__()
        self.root_rank, self.device = root_rank, device
        self.broadcast_done = False
        self._local_vars = set()
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple)):
            local_variables = [local_variables]
        for var in local_variables:
            self.register_local_var(var)

    def register_local_var(self, var):
        """This variable is not broadcast."""
        self._local_vars.add(id(var))

    def _broadcast(self):
        model = self.model
        if _torch_backend.active(model):  # Keras 3 on torch: its variables hold torch tensors
            opt = getattr(model, "optimizer", None)
            _torch_backend.broadcast([v for v in model.variables if id(v) not in self._local_vars]
                                     + (list(opt.variables) if opt is not None else []), self.root_rank)
            return
        with tf.device(self.device):
            if not tf.executing_eagerly():
                tf.compat.v1.keras.backend.get_session().run(hvd.broadcast_global_variables(self.root_rank))
                return
            hvd.broadcast_variables(_tf_variables(v for v in model.variables if id(v) not in self._local_vars),
                                    root_rank=self.root_rank)
            opt = getattr(model, "optimizer", None)
            if opt is not None and list(opt.variables):
                hvd.broadcast_variables(_tf_variables(list(opt.variables)), root_rank=self.root_rank)

    def on_train_begin(self, logs=None):
        if self.broadcast_done or not tf.executing_eagerly():
            return
        opt = getattr(self.model, "optimizer", None)
        if opt is not None and is_keras3(opt) and not opt.built:
            opt.build(self.model.trainable_variables)
        self._broadcast()  # the first step starts from root's weights
        self.broadcast_done = opt is not None and is_keras3(opt)

    def on_batch_end(self, batch, logs=None):
        if not self.broadcast_done:  # tf-keras creates its optimizer's variables in the first step
            self._broadcast()
            self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Averages the epoch's metrics over the ranks (in name order) in the logs that the callbacks
    after it (and the History) see."""

    def __init__(self, device=""):
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        with tf.device(self.device):
            for metric in sorted(logs):
                logs[metric] = _value(hvd.allreduce(tf.constant(logs[metric], dtype=tf.float64),
                                                    name=None, op=hvd.Average))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` to
    ``end_epoch`` (exclusive): at each epoch's start (``staircase``), or at each batch's start with
    a fractional epoch. ``multiplier`` a number: ``multiplier ** (epoch - start_epoch)``."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr, self.start_epoch, self.end_epoch = initial_lr, start_epoch, end_epoch
        self.staircase, self.momentum_correction, self.steps_per_epoch = staircase, momentum_correction, steps_per_epoch
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier ** (epoch - start_epoch))
        self.current_epoch = None
        self.restore_momentum = None

    def _autodetect_steps_per_epoch(self):
        if self.params.get("steps"):
            return self.params["steps"]
        if self.params.get("samples") and self.params.get("batch_size"):
            return self.params["samples"] // self.params["batch_size"]
        raise ValueError("Could not autodetect the number of steps per epoch. Please specify the steps_per_epoch "
                         "parameter to the %s()." % type(self).__name__)

    def _get_lr(self) -> float:
        return _value(self.model.optimizer.learning_rate)

    def _set_lr(self, value) -> None:
        lr = self.model.optimizer.learning_rate
        if hasattr(lr, "assign"):
            lr.assign(value)
        else:
            self.model.optimizer.learning_rate = value

    def _adjust_learning_rate(self, epoch):
        opt = self.model.optimizer
        old_lr = self._get_lr()
        new_lr = self.initial_lr * self.multiplier(epoch)
        self._set_lr(new_lr)
        if not (hasattr(opt, "momentum") and self.momentum_correction) or old_lr == 0:
            return
        if is_keras3(opt):  # the same update as momentum * new/old for one batch: velocities scaled
            if _value(opt.momentum) and getattr(opt, "momentums", None):
                for v in opt.momentums:
                    v.assign(v * (new_lr / old_lr))
            return
        self.restore_momentum = _value(opt.momentum)
        self._set_momentum(self.restore_momentum * new_lr / old_lr)

    def _set_momentum(self, value):
        m = self.model.optimizer.momentum
        if hasattr(m, "assign"):
            m.assign(value)
        else:
            self.model.optimizer.momentum = value

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (self.end_epoch is not None and
                                                     self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_batch_end(self, batch, logs=None):
        if self.restore_momentum is not None:
            self._set_momentum(self.restore_momentum)
            self.restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = self._get_lr()


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warmup (Goyal et al.): from ``initial_lr / size`` at the start to ``initial_lr``
    after ``warmup_epochs``, adjusted every batch."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            epoch += 1.0 / self.steps_per_epoch  # round numbers at the end of each epoch, as Horovod's
            return 1.0 / hvd.size() * (epoch * (hvd.size() - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and hvd.rank() == 0:
            print("\nEpoch %d: finished gradual learning rate warmup to %g." % (epoch + 1, self._get_lr()))


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """``ModelCheckpoint`` with ``save_best_only``, written by rank 0 only. ``filepath`` (not in
    Horovod's signature, where its estimator sets it) defaults to ``best.keras`` (Keras 3),
    ``best.weights.h5`` with ``save_weights_only``, or ``best.h5`` (tf-keras)."""

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto", save_freq="epoch",
                 filepath=None):
        if filepath is None:
            legacy = keras.__name__.startswith("tf_keras")
            filepath = "best.h5" if legacy else ("best.weights.h5" if save_weights_only else "best.keras")
        super().__init__(filepath=filepath, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)

    def _save_model(self, *args, **kwargs):
        if hvd.rank() == 0:
            return super()._save_model(*args, **kwargs)
        return None
