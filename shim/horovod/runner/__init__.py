"""``horovod.runner``: ``run`` (``horovod.run``) = ``appliance.hvdcompat.run.run``, which starts the
ranks through ``appliance.launcher.launch``. The ``horovodrun`` command is the appliance package's
console script (``appliance/hvdcompat/horovodrun.py``)."""
from appliance.hvdcompat.run import run  # noqa: F401
