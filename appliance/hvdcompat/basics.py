"""``horovod.common.basics``: ``HorovodBasics``, the framework-independent lifecycle object.

Horovod builds one per framework library; here every instance is a view of the one runtime
(``appliance.runtime.api``), so ``HorovodBasics().rank()`` equals ``hvd.rank()``. The reduce-op
constants (``Average``... ``Product``) are the runtime's; ``init(process_sets=...)`` registers
process sets as ``hvd.init`` does. ``start_timeline``/``stop_timeline`` are the runtime's (rank 0
writes the file), as in ``appliance.torch``.
Does not import torch. Failure modes: ``ValueError`` before ``init`` (as Horovod).
"""
from __future__ import annotations

from appliance.runtime import api
from appliance.runtime import process_sets as _ps
from appliance.runtime.engine import Adasum, Average, Max, Min, Product, Sum
from appliance.hvdcompat import util


class HorovodBasics:
    """Lifecycle, ranks and build probes of the runtime (arguments of Horovod's constructor,
    the framework library path and name, are accepted and ignored)."""

    Average, Sum, Adasum, Min, Max, Product = Average, Sum, Adasum, Min, Max, Product

    def __init__(self, pkg_path=None, *args):
        self.pkg_path = pkg_path

    def init(self, comm=None, process_sets=None):
        fresh = not api.is_initialized()
        api.init()
        if fresh:
            try:
                _ps.check_comm(comm)
                _ps.setup(process_sets)
            except Exception:
                api.shutdown()
                raise

    def shutdown(self):
        api.shutdown()

    def _get_process_set_ids_and_ranks(self):
        """``{id: ranks}`` of the registered process sets (Horovod's tests read it)."""
        api.size()  # ValueError before init
        return _ps.ids_and_ranks()

    def is_initialized(self):
        return api.is_initialized()

    def size(self):
        return api.size()

    def rank(self):
        return api.rank()

    def local_size(self):
        return api.local_size()

    def local_rank(self):
        return api.local_rank()

    def cross_size(self):
        return api.cross_size()

    def cross_rank(self):
        return api.cross_rank()

    def is_homogeneous(self):
        return api.is_homogeneous()

    def start_timeline(self, file_path, mark_cycles=False):
        api.start_timeline(file_path, mark_cycles)

    def stop_timeline(self):
        api.stop_timeline()

    def mpi_threads_supported(self):
        return False

    def mpi_enabled(self):
        return False

    def mpi_built(self):
        return util.mpi_built()

    def gloo_enabled(self):
        return False

    def gloo_built(self):
        return util.gloo_built()

    def nccl_built(self):
        return util.nccl_built()

    def ddl_built(self):
        return False

    def ccl_built(self):
        return False

    def cuda_built(self):
        return util.gpu_available("torch")

    def rocm_built(self):
        return False


__all__ = ["HorovodBasics"]
