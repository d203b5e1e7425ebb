"""``horovod.runner``: ``run`` (``horovod.run``) = ``appliance.hvdcompat.run.run``, which starts the
ranks through ``appliance.launcher.launch``. The ``horovodrun`` command is docker/pyshim/horovodrun."""
from appliance.hvdcompat.run import run  # noqa: F401
