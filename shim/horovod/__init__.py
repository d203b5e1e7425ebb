"""Horovod's package name, served by the appliance (appliance-horovod-shim).

A thin layer of re-exports: ``horovod.torch`` is ``appliance.torch`` itself (one runtime state),
``horovod.tensorflow`` is ``appliance.tensorflow`` (the same runtime), ``horovod.keras`` and
``horovod.tensorflow.keras`` are ``appliance.tensorflow.keras``,
``horovod.common.*`` and ``horovod.runner.*`` re-export ``appliance.hvdcompat``, and ``horovod.run``
launches through ``appliance.launcher.launch``. ``__version__`` is the Horovod release this layout
is compatible with (``appliance.__version__`` is the appliance's own). Nothing else of Horovod
(MXNet, Spark, Ray) is provided: importing those fails with ImportError, as on
a Horovod built without them. Elastic scripts run on a fixed set of hosts (a lost rank ends the
job). The ``horovodrun`` command is the appliance package's own console script.

Installed by ``shim/install_horovod.py``, in the image and elsewhere alike; it sits on sys.path
after site-packages, so it never shadows a real Horovod.
"""
from appliance.hvdcompat import HOROVOD_VERSION as __version__  # noqa: F401
from horovod.runner import run  # noqa: F401
