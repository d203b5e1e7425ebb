"""``horovod.torch`` is ``appliance.torch`` in the appliance image (the same module object).

Replacing this module in ``sys.modules`` makes ``import horovod.torch as hvd`` bind
``appliance.torch``, and ``hvd.init is appliance.torch.init``; the already-loaded submodules
(``mpi_ops``, ``optimizer``, ``functions``, ``compression``, ``elastic``, ``sync_batch_norm``) are registered under
``horovod.torch.*`` too, so ``from horovod.torch.mpi_ops import allreduce`` does not load a second
copy with its own state. Failure modes: ImportError when the appliance (or torch) is missing.
"""
import sys

import appliance.torch as _impl

for _name, _module in list(sys.modules.items()):
    if _name.startswith("appliance.torch."):
        sys.modules["horovod.torch." + _name[len("appliance.torch."):]] = _module
sys.modules[__name__] = _impl
