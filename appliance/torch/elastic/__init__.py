"""``horovod.torch.elastic``: Horovod's elastic training API on a fixed set of hosts.

What it is: ``run`` (the decorator), ``State``, ``ObjectState``, ``TorchState``,
``ElasticSampler`` and ``HostUpdateResult``, so that Horovod elastic scripts run unchanged::

    state = hvd.elastic.TorchState(model=model, optimizer=opt, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...  # state.commit() every few batches

    train(state)

``run(func)`` returns ``wrapper(state, *args, **kwargs)``: it syncs ``state`` from rank 0, calls
``func``; on ``HostsUpdatedInterrupt`` (a host-set change seen by a ``commit``, or raised by the
script on every rank) it re-initialises the runtime (``shutdown()`` + ``init()``), calls
``state.on_reset()`` (``reset`` + the registered callbacks), syncs unless the interrupt says
``skip_sync`` and calls ``func`` again; on ``HorovodInternalError`` (a lost rank, an aborted
job) it restores the last commit and re-raises. Horovod would instead re-form the job from the
surviving workers; this runtime's hosts are fixed, so the job ends loudly. What a future elastic
launcher needs from the runtime is written in ``appliance.hvdcompat.elastic``'s docstring.

Layout (as Horovod's): ``sampler`` (``ElasticSampler``), ``state`` (``TorchState`` and its
handlers); the framework-free ``State``/``ObjectState``/``run_fn`` are in
``appliance.hvdcompat.elastic`` (``horovod.common.elastic``). Reads no environment.
Failure modes: those of the collectives; ``HorovodInternalError`` always leaves ``run``.
"""
from __future__ import annotations

from appliance.hvdcompat.elastic import HostUpdateResult, State, run_fn
from appliance.torch.elastic.sampler import ElasticSampler
from appliance.torch.elastic.state import ObjectState, TorchState
from appliance.torch.mpi_ops import init, shutdown


def _reset() -> None:
    shutdown()
    init()


def run(func):
    """Decorate ``func(state, *args, **kwargs)`` to run under the elastic loop (module docstring)."""
    return run_fn(func, _reset)


__all__ = ["ElasticSampler", "HostUpdateResult", "ObjectState", "State", "TorchState", "run"]
