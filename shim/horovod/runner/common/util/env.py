"""``horovod.runner.common.util.env``: ``get_env_rank_and_size``, a rank's (rank, size) from the
environment its launcher set: ``HOROVOD_RANK``/``HOROVOD_SIZE`` (``appliance launch``,
``horovodrun``), else Open MPI's ``OMPI_COMM_WORLD_*``, else ``PMI_RANK``/``PMI_SIZE``; (0, 1)
without any. One of a pair without the other raises RuntimeError naming both."""
import os

_PAIRS = (("HOROVOD_RANK", "HOROVOD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
          ("PMI_RANK", "PMI_SIZE"))


def get_env_rank_and_size():
    for rank_var, size_var in _PAIRS:
        rank, size = os.environ.get(rank_var), os.environ.get(size_var)
        if rank is not None and size is not None:
            return int(rank), int(size)
        if rank is not None or size is not None:
            raise RuntimeError(f"Could not determine process rank and size: only one of {rank_var} and {size_var} "
                               "found in environment")
    return 0, 1
