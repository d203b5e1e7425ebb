"""``horovod.tensorflow`` is ``appliance.tensorflow`` in the appliance image (the same module object).

Replacing this module in ``sys.modules`` makes ``import horovod.tensorflow as hvd`` bind
``appliance.tensorflow``; its already-loaded submodules (``mpi_ops``, ``compression``,
``functions``, ``optimizer``) are registered under ``horovod.tensorflow.*`` too, so
``from horovod.tensorflow.mpi_ops import allgather`` does not load a second copy with its own
state. Failure modes: ImportError when the appliance (or TensorFlow) is missing.
"""
import sys

import appliance.tensorflow as _impl

for _name, _module in list(sys.modules.items()):
    if _name.startswith("appliance.tensorflow."):
        sys.modules["horovod.tensorflow." + _name[len("appliance.tensorflow."):]] = _module
sys.modules[__name__] = _impl
