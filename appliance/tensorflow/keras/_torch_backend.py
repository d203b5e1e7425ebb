"""Keras 3 with ``KERAS_BACKEND=torch`` under ``horovod.keras``: its gradients and variables are
torch tensors, which TensorFlow's op library cannot take, so they go through the runtime's numpy
API (``appliance.runtime.api``, the layer under both framework bindings) instead.

What it owns: ``active(obj)`` (whether an optimizer or model runs on Keras 3's torch backend),
``reduce`` (a step's dense gradients, one grouped allreduce per dtype, as numpy views of the CPU
tensors; results back as the backend's tensors) and ``broadcast`` (variables assigned from the
root's). The averaging, the broadcast callback and the metric average work; what needs
TensorFlow tensors does not: sparse gradients (the torch backend has none), compression,
``groups``, process sets other than the global one and ``backward_passes_per_step`` > 1 raise
``NotImplementedError`` naming the option. Environment: ``KERAS_BACKEND`` (Keras's). Failure
modes: the collectives' errors (``appliance.runtime.api``).
"""
import numpy as np

from appliance.runtime import api


def active(obj) -> bool:
    """Whether ``obj`` is Keras 3's and Keras 3 runs on torch."""
    if not any(c.__module__.startswith("keras.") for c in type(obj).__mro__):
        return False
    import keras

    return keras.backend.backend() == "torch"


def refuse(what: str) -> None:
    raise NotImplementedError(f"horovod.keras on KERAS_BACKEND=torch: {what} is not supported "
                              "(the gradients are averaged through the runtime's numpy API)")


def _numpy(tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()


def reduce(grads, variables, reducer) -> list:
    """``grads`` (torch tensors or None) reduced as ``reducer`` (``_optimizer.Reducer``) says."""
    import keras

    out = list(grads)
    if not reducer.process_set.included():
        return out
    todo = [i for i, g in enumerate(out) if g is not None and id(variables[i]) not in reducer.local_ids]
    for dtype in sorted({str(out[i].dtype) for i in todo}):
        idx = [i for i in todo if str(out[i].dtype) == dtype]
        arrays = [_numpy(out[i]) * reducer.pre if reducer.pre != 1.0 else _numpy(out[i]) for i in idx]
        for i, r in zip(idx, api.grouped_allreduce(arrays, op=reducer.op)):
            if reducer.post != 1.0:
                r = r * reducer.post
            out[i] = keras.ops.convert_to_tensor(r)
    if reducer.scale_local and reducer.local_ids:  # Horovod divides a local gradient by the set's size
        n = reducer.process_set.size()
        out = [g / n if g is not None and id(v) in reducer.local_ids else g for g, v in zip(out, variables)]
    return out


def broadcast(variables, root_rank: int) -> None:
    """Every variable assigned the root rank's value."""
    for v in variables:
        value = np.ascontiguousarray(np.asarray(v)).reshape(-1)  # a scalar variable reads as shape (1,)
        v.assign(api.broadcast(value, root_rank).reshape(tuple(v.shape)))
