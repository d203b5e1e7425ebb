"""``horovod.runner.util.threads`` = ``appliance.hvdcompat.threads``."""
from appliance.hvdcompat.threads import *  # noqa: F401,F403
from appliance.hvdcompat.threads import __all__  # noqa: F401
