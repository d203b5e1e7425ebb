"""``horovod.common.process_sets``: Horovod's process-set API (``appliance.runtime.process_sets``)."""
from appliance.runtime.process_sets import (  # noqa: F401
    ProcessSet, add_process_set, global_process_set, remove_process_set,
)
