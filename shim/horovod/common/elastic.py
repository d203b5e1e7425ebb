"""``horovod.common.elastic`` = ``appliance.hvdcompat.elastic`` (``State``, ``ObjectState``, ``run_fn``)."""
from appliance.hvdcompat.elastic import *  # noqa: F401,F403
from appliance.hvdcompat.elastic import __all__  # noqa: F401
