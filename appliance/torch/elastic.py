"""``horovod.torch.elastic``: Horovod's elastic names, not implemented yet.

What it is: ``run``, ``State``, ``ObjectState``, ``TorchState`` and ``ElasticSampler`` exist so that
elastic scripts import; using any of them (decorating a function with ``hvd.elastic.run``, building
a state or a sampler) raises ``NotImplementedError`` naming the feature and issue 9, never a
silent non-elastic run. Elastic training is a later item of issue 9. Owns nothing; reads no
environment.
"""
from __future__ import annotations


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(f"Horovod elastic ({what}) is not implemented by this runtime yet (issue 9); "
                               "run the script without hvd.elastic")


def run(func):
    """Horovod's elastic decorator: raises NotImplementedError (elastic is not implemented yet)."""
    raise _unsupported(f"hvd.elastic.run({getattr(func, '__name__', func)!r})")


class State:
    """Horovod's elastic state base class; constructing it raises NotImplementedError."""

    def __init__(self, *args, **kwargs):
        raise _unsupported(f"hvd.elastic.{type(self).__name__}")


class ObjectState(State):
    """Horovod's elastic state of plain Python objects; constructing it raises NotImplementedError."""


class TorchState(ObjectState):
    """Horovod's elastic state of a model and optimizer; constructing it raises NotImplementedError."""


class ElasticSampler:
    """Horovod's elastic data sampler; constructing it raises NotImplementedError."""

    def __init__(self, *args, **kwargs):
        raise _unsupported("hvd.elastic.ElasticSampler")


__all__ = ["ElasticSampler", "ObjectState", "State", "TorchState", "run"]
