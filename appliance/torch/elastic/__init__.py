"""``horovod.torch.elastic``: Horovod's elastic training API.

What it is: ``run`` (the decorator), ``State``, ``ObjectState``, ``TorchState``,
``ElasticSampler`` and ``HostUpdateResult``, so that Horovod elastic scripts run unchanged::

    state = hvd.elastic.TorchState(model=model, optimizer=opt, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...  # state.commit() every few batches

    train(state)

``run(func)`` returns ``wrapper(state, *args, **kwargs)``: it syncs ``state`` from rank 0, calls
``func``; on ``HorovodInternalError`` (a lost rank) it restores the last commit, on
``HostsUpdatedInterrupt`` (a host-set change seen by a ``commit`` on every rank) it keeps the
state; either way it re-initialises the runtime (``shutdown()`` + ``init()``: in an elastic job
launched with ``--min-np``/``--max-np``/``--host-discovery-script`` the next round of the
driver), calls ``state.on_reset()`` (``reset`` + the registered callbacks), syncs from the new
rank 0 when the round says so and calls ``func`` again. Without an elastic launcher the hosts
are fixed: ``HorovodInternalError`` is re-raised after the restore. The loop itself is
``appliance.hvdcompat.elastic.run_fn`` (``horovod.common.elastic``).

Layout (as Horovod's): ``sampler`` (``ElasticSampler``), ``state`` (``TorchState`` and its
handlers); the framework-free ``State``/``ObjectState``/``run_fn`` are in
``appliance.hvdcompat.elastic``. Reads no environment.
Failure modes: those of the collectives; ``HorovodInternalError`` leaves ``run`` only without
an elastic launcher, or when the driver ends the job.
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
