"""``horovod.common.exceptions`` = ``appliance.hvdcompat.exceptions`` (the same classes)."""
from appliance.hvdcompat.exceptions import *  # noqa: F401,F403
from appliance.hvdcompat.exceptions import __all__  # noqa: F401
