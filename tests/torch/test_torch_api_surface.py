"""appliance.torch offers horovod.torch's public names (pure logic; no ranks needed), and
importing the framework-free runtime does not import torch."""
import subprocess
import sys

import pytest

# horovod/torch/__init__.py's exports.
HOROVOD_TORCH_NAMES = """
Compression allgather_object broadcast_object broadcast_optimizer_state broadcast_parameters
allreduce allreduce_async allreduce_ allreduce_async_ grouped_allreduce grouped_allreduce_async
grouped_allreduce_ grouped_allreduce_async_ sparse_allreduce_async allgather allgather_async
grouped_allgather grouped_allgather_async broadcast broadcast_async broadcast_ broadcast_async_
alltoall alltoall_async reducescatter reducescatter_async grouped_reducescatter
grouped_reducescatter_async join barrier poll synchronize init shutdown is_initialized
start_timeline stop_timeline size local_size cross_size rank local_rank cross_rank
mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built ddl_built ccl_built
cuda_built rocm_built ProcessSet global_process_set add_process_set remove_process_set Average Sum
Adasum Min Max Product HorovodInternalError DistributedOptimizer SyncBatchNorm elastic
""".split()


def test_every_horovod_torch_name_exists():
    hvd = pytest.importorskip("appliance.torch")
    missing = [n for n in HOROVOD_TORCH_NAMES if not hasattr(hvd, n)]
    assert not missing, missing
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)
    from appliance.runtime.errors import HorovodInternalError
    assert hvd.HorovodInternalError is HorovodInternalError and issubclass(HorovodInternalError, RuntimeError)


def test_calls_before_init_raise_value_error():
    hvd = pytest.importorskip("appliance.torch")
    import torch
    assert not hvd.is_initialized()
    for call in (hvd.size, hvd.rank, lambda: hvd.allreduce(torch.ones(2)), lambda: hvd.broadcast_(torch.ones(2), 0)):
        with pytest.raises(ValueError):
            call()


def test_compression_fp16_round_trip():
    hvd = pytest.importorskip("appliance.torch")
    import torch
    x = torch.tensor([1.0, 2.5, -3.25], dtype=torch.float64)
    c, ctx = hvd.Compression.fp16.compress(x)
    assert c.dtype == torch.float16 and ctx == torch.float64
    back = hvd.Compression.fp16.decompress(c, ctx)
    assert back.dtype == torch.float64 and torch.equal(back, x)
    i = torch.arange(3)
    assert hvd.Compression.fp16.compress(i)[0] is i and hvd.Compression.none.compress(x) == (x, None)


def test_runtime_does_not_import_torch():
    code = "import sys, appliance.runtime, appliance.runtime.engine; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
