"""``horovod.common.process_sets``: the process-set names of ``appliance.torch`` (only the global
set works yet; others raise NotImplementedError naming issue 9)."""
from appliance.torch.mpi_ops import (  # noqa: F401
    ProcessSet, add_process_set, global_process_set, remove_process_set,
)
