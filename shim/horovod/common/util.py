"""``horovod.common.util`` = ``appliance.hvdcompat.util``."""
from appliance.hvdcompat.util import *  # noqa: F401,F403
from appliance.hvdcompat.util import __all__  # noqa: F401
