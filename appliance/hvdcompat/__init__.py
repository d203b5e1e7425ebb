"""Horovod-compatibility helpers behind the ``horovod`` package shim (``docker/pyshim/horovod``).

What it is: the framework-free parts of Horovod's Python layout that scripts import, implemented
here so the shim stays a set of one-line re-exports: ``exceptions`` (horovod.common.exceptions),
``util`` (horovod.common.util), ``basics`` (horovod.common.basics), ``elastic``
(horovod.common.elastic: the elastic state and run loop without torch), ``threads``
(horovod.runner.util.threads) and ``run`` (``horovod.run`` onto ``appliance.launcher.launch``).
The torch API itself is ``appliance.torch``. ``HOROVOD_VERSION`` is the Horovod release this
layout is compatible with (the shim's ``horovod.__version__``); ``appliance.__version__`` is ours.
Importing this package does not import torch. Reads no environment; owns nothing.
"""
HOROVOD_VERSION = "0.28.1"
