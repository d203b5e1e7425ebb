"""Horovod's package name in the appliance image, served by the appliance.

This directory (docker/pyshim) is copied into the image's /opt/venv only; it is not part of the
appliance wheel, so installing ``appliance`` elsewhere never shadows a real Horovod. It lets
unchanged Horovod scripts run: ``import horovod.torch as hvd`` gives ``appliance.torch`` itself
(see ``horovod/torch/__init__.py``). Nothing else of Horovod (TensorFlow, Keras, MXNet, Spark,
Ray, elastic) is provided: importing those fails with ImportError, as on a Horovod built without them.
"""
from appliance import __version__  # noqa: F401
