"""Horovod compatibility in one place: the framework-free parts of Horovod's layout and ``horovodrun``.

What it is: the parts of Horovod's Python layout that scripts import, implemented here so the
``horovod`` package (``shim/horovod``, installed by ``shim/install_horovod.py``) stays a set of
one-line re-exports: ``exceptions`` (horovod.common.exceptions), ``util`` (horovod.common.util),
``basics`` (horovod.common.basics), ``elastic`` (horovod.common.elastic: the elastic state and
run loop without torch), ``threads`` (horovod.runner.util.threads) and ``run`` (``horovod.run``
onto ``appliance.launcher.launch``, its ranks running ``runfn``); and ``horovodrun`` (the
``horovodrun`` command: horovodrun's flags onto the launcher, or a real Horovod's own horovodrun
when one is installed). The torch API itself is ``appliance.torch``. ``HOROVOD_VERSION`` is the
Horovod release this layout is compatible with (the shim's ``horovod.__version__``);
``appliance.__version__`` is ours. ``SHIM_MARKER`` is the text that tells the compatibility
package's ``horovod/__init__.py`` from a real Horovod's (``install_horovod.py`` keeps a copy: it
runs on the standard library alone).

Importing this package imports neither torch nor the launcher. Reads no environment; owns nothing.
"""
HOROVOD_VERSION = "0.28.1"
SHIM_MARKER = "appliance-horovod-shim"
