"""``horovod.common.basics`` = ``appliance.hvdcompat.basics`` (``HorovodBasics``)."""
from appliance.hvdcompat.basics import HorovodBasics  # noqa: F401
