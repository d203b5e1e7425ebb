"""``horovod.keras`` is ``appliance.tensorflow.keras`` in the appliance image (the same module object
as ``horovod.tensorflow.keras``): Horovod's Keras API for Keras 3 and tf-keras on TensorFlow.

Replacing this module in ``sys.modules`` makes ``import horovod.keras as hvd`` bind it, and
``horovod.keras.callbacks`` and ``.elastic`` its own, so no second copy is loaded. Failure modes:
ImportError when the appliance or TensorFlow is missing.
"""
import sys

import appliance.tensorflow.keras as _impl

sys.modules[__name__ + ".callbacks"] = _impl.callbacks
sys.modules[__name__ + ".elastic"] = _impl.elastic
sys.modules[__name__] = _impl
