"""``horovod.torch.elastic.state``: ``ObjectState`` and ``TorchState`` over ``appliance.torch``.

What it is: ``ObjectState`` (``appliance.hvdcompat.elastic.ObjectState`` whose ``bcast_object`` and
``get_rank`` default to ``hvd.broadcast_object`` from rank 0 and ``hvd.rank``) and ``TorchState``:
keyword arguments that are a ``torch.nn.Module``, a ``torch.optim.Optimizer`` or an
``ElasticSampler`` get a handler (``model=`` and ``optimizer=`` are the usual two; any number of
each kind works), every other one is a plain attribute as in ``ObjectState``. For a handled value
``save`` deep-copies its ``state_dict()``, ``restore`` loads the copy back into the same object,
and ``sync`` makes rank 0's current value everyone's: ``broadcast_parameters`` of a model's
``state_dict`` (parameters and buffers), ``broadcast_optimizer_state`` of an optimizer, and for a
sampler rank 0's epoch with the union of every rank's processed indices (``allgather_object``).
Assigning a new object to a handled attribute (``state.model = other``) tracks and saves it.
``reset`` (after a host-set change) recomputes every sampler's partition for the new size.

``get_handler_registry`` / ``set_handler_registry`` (Horovod's names) expose the
``[(type, handler class)]`` table for custom kinds of state. Owns the saved copies; reads no
environment. Failure modes: those of the collectives in ``sync`` (``HorovodInternalError``,
``MismatchError`` when ranks hold differently shaped models).
"""
from __future__ import annotations

import copy

import torch

from appliance.hvdcompat import elastic as _common
from appliance.runtime import metrics as _metrics
from appliance.torch.elastic.sampler import ElasticSampler
from appliance.torch.functions import (
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters,
)
from appliance.torch.mpi_ops import rank


class ObjectState(_common.ObjectState):
    """Plain picklable objects as attributes, synced from rank 0 with ``hvd.broadcast_object``."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        super().__init__(bcast_object=bcast_object or broadcast_object, get_rank=get_rank or rank, **kwargs)

    def commit(self) -> None:
        _metrics.note_step("commit")  # a step for the metrics where the script has no DistributedOptimizer
        super().commit()


class StateHandler:
    """Keeps one object's saved copy: ``save``, ``restore``, ``sync`` and ``set_value``."""

    def __init__(self, value):
        self.value = value
        self.save()

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Adjust to a new set of workers; nothing by default."""

    def set_value(self, value) -> None:
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """An object with ``state_dict()``/``load_state_dict()``; the copy is a deep copy."""

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self._saved))


class ModelStateHandler(_StateDictHandler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(_StateDictHandler):
    def sync(self) -> None:
        mine = self.value.state_dict()
        everyone = allgather_object(mine["processed_indices"])
        merged = broadcast_object(mine, root_rank=0)
        merged = dict(merged, processed_indices=sorted(set().union(*map(set, everyone))))
        merged["processed_num"] = len(merged["processed_indices"])
        self.value.load_state_dict(merged)

    def reset(self) -> None:
        self.value.reset()


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> list:
    return _handler_registry


def set_handler_registry(registry) -> None:
    global _handler_registry
    _handler_registry = list(registry)


def _handler_for(value):
    for kind, handler_cls in _handler_registry:
        if isinstance(value, kind):
            return handler_cls(value)
    return None


class TorchState(ObjectState):
    """The state of a PyTorch training loop: ``model``, ``optimizer`` and any other keyword
    arguments (samplers, epoch and batch counters...), each exposed as an attribute."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for key, value in kwargs.items():
            handler = _handler_for(value)
            if handler is None:
                plain[key] = value
            else:
                handlers[key] = handler
        object.__setattr__(self, "_handlers", handlers)
        for key, handler in handlers.items():
            object.__setattr__(self, key, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self) -> None:
        for handler in self._handlers.values():
            handler.reset()
        super().reset()


__all__ = ["ModelStateHandler", "ObjectState", "OptimizerStateHandler", "SamplerStateHandler", "StateHandler",
           "TorchState", "get_handler_registry", "set_handler_registry"]
