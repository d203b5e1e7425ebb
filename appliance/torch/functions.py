"""Helpers that make every rank start from the same state, as ``horovod.torch.functions``.

``broadcast_parameters`` (a ``state_dict``, ``named_parameters()`` or ``parameters()``, in place),
``broadcast_optimizer_state`` (tensors in place, scalars and hyper-parameters as one pickled
object; creates the state of an optimizer that has not stepped yet, as Horovod does),
``broadcast_object`` and ``allgather_object`` (pickled with cloudpickle when it is importable,
else pickle). Owns nothing; reads no environment. Failure modes are those of the collectives
(``HorovodInternalError``, ``MismatchError`` when ranks pass differently shaped tensors).
"""
from __future__ import annotations

import collections
import io

import torch

from appliance.runtime import engine as _engine
from appliance.torch.mpi_ops import (
    check_process_set, allgather, broadcast_, broadcast_async_, global_process_set, rank, synchronize_all,
)

try:
    import cloudpickle as _pickle
except ImportError:  # pragma: no cover - cloudpickle is optional
    import pickle as _pickle


def broadcast_parameters(params, root_rank):
    """Overwrite ``params`` on every rank with root's values, in place.

    ``params`` is a dict (``model.state_dict()``; broadcast in sorted-key order, named by key)
    or an iterable of tensors or ``(name, tensor)`` pairs (``model.named_parameters()``,
    ``model.parameters()``). All broadcasts are started, then all are waited for.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        try:
            items = [p if isinstance(p, tuple) else (None, p) for p in params]
        except TypeError:
            raise ValueError(f"invalid params of type: {type(params)}") from None
    synchronize_all([broadcast_async_(p, root_rank, name) for name, p in items])


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Make every rank's optimizer state (per-parameter state and param_group options such as
    the learning rate) equal to root's. Tensors are broadcast in place; scalars travel in one
    ``broadcast_object``. An optimizer without state yet gets it from one step with zero
    gradients first (as Horovod). ``model`` identifies sparse embeddings."""
    from appliance.torch.optimizer import local_step

    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()

    if len(state_dict["state"]) == 0:
        sparse = set()
        if model is not None:
            for m in model.modules():
                if isinstance(m, torch.nn.Embedding) and m.sparse:
                    sparse.update(id(p) for p in m.parameters())
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p.data)
                    if isinstance(optimizer, torch.optim.SparseAdam) or (
                            isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                        p.grad = p.grad.to_sparse()
        local_step(optimizer)  # a DistributedOptimizer's own step would allreduce
        state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        return  # a stateless optimizer: nothing to broadcast

    tensors = []
    scalars = {}
    setters = {}
    occurrences = collections.defaultdict(int)

    def set_option(index, key):
        def assign(v):
            optimizer.param_groups[index][key] = v
        return assign

    def set_state(pid, key):
        def assign(v):
            state_dict["state"][pid][key] = v
        return assign

    for index, group in enumerate(state_dict["param_groups"]):
        for key, value in group.items():
            if key != "params":
                scalars[f"{key}.{index}"] = value
                setters[f"{key}.{index}"] = set_option(index, key)
        for pid in group["params"]:
            if pid not in state_dict["state"]:
                continue  # a parameter that never had a gradient
            for key, value in state_dict["state"][pid].items():
                occurrences[key] += 1
                unique = f"{key}.{occurrences[key]}"
                if torch.is_tensor(value):
                    tensors.append((unique, value))
                else:
                    scalars[unique] = value
                    setters[unique] = set_state(pid, key)

    broadcast_parameters(tensors, root_rank)
    for key, value in broadcast_object(scalars, root_rank).items():
        setters[key](value)


def _dumps(obj) -> torch.Tensor:
    buf = io.BytesIO()
    _pickle.dump(obj, buf)
    return torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)


def _loads(t: torch.Tensor):
    return _pickle.loads(t.numpy().tobytes())


def _names(kind: str, name, process_set, ps_id: int) -> tuple:
    """The two operation names of an object collective: from ``name``, else from a per-set
    sequence of these calls (independent of other operations and of the object's type)."""
    if name is None:
        name = f"{kind}.{_engine.current().next_in_sequence((kind, ps_id))}"
    return f"{name}.sz", f"{name}.t"


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Root's ``obj`` (anything picklable) on every rank of ``process_set``. Ranks may pass
    objects of different types (e.g. None): the names do not depend on the object."""
    names = _names("broadcast_object", name, process_set, check_process_set(process_set))
    if rank() == root_rank:
        payload = _dumps(obj)
        broadcast_(torch.tensor([payload.numel()], dtype=torch.int64), root_rank, names[0], process_set=process_set)
        broadcast_(payload, root_rank, names[1], process_set=process_set)
        return obj
    length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, names[0], process_set=process_set)
    payload = torch.empty(int(length.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, names[1], process_set=process_set)
    return _loads(payload)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every ``obj`` (anything picklable) of the ranks of ``process_set``, as a list in rank order."""
    names = _names("allgather_object", name, process_set, check_process_set(process_set))
    payload = _dumps(obj)
    lengths = allgather(torch.tensor([payload.numel()], dtype=torch.int64), name=names[0],
                        process_set=process_set).tolist()
    gathered = allgather(payload, name=names[1], process_set=process_set)
    out, start = [], 0
    for n in lengths:
        out.append(_loads(gathered[start:start + n]))
        start += n
    return out
