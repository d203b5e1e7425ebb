"""CUDA tensors end to end on real GPUs (marker gpu: collected only where a GPU exists; see tests/fixtures/gpu.py).

1 rank through NCCL; 2 ranks on one GPU through host staging (NCCL refuses them); N ranks on
N GPUs through NCCL; the dtype x op matrix with fp16/bf16 and scale factors; allgather with
differing first dimensions, broadcast, alltoall with splits, uneven reducescatter; async
handles; a DistributedOptimizer step that equals one process; process sets, Adasum,
SyncBatchNorm and join on CUDA tensors.
"""
import pytest
import torch

pytestmark = pytest.mark.gpu

GPUS = torch.cuda.device_count()


def check(ranks, n, path):
    for r in range(n):
        rep = ranks[r]
        assert rep["ok"] and rep["checked"] > 0, rep
        assert rep["path"] == path, rep


def test_one_rank_through_nccl(run_ranks):
    ranks = run_ranks(1, "torch_gpu", "ops", timeout=300)
    check(ranks, 1, "nccl")
    assert ranks[0]["nccl_built"] > 21200


def test_two_ranks_on_one_gpu_go_through_host_memory(run_ranks):
    ranks = run_ranks(2, "torch_gpu", "ops", env={"TORCH_GPU_PIN": "0"}, timeout=300)
    check(ranks, 2, "staging")
    assert "ranks 0 and 1 share one GPU" in ranks[0]["why"]


@pytest.mark.skipif(GPUS < 2, reason=f"needs 2 or more GPUs; this machine has {GPUS}")
def test_n_ranks_on_n_gpus_through_nccl(run_ranks):
    ranks = run_ranks(GPUS, "torch_gpu", "ops", timeout=300)
    check(ranks, GPUS, "nccl")
    assert sorted(ranks[r]["device"] for r in range(GPUS)) == list(range(GPUS))


def test_optimizer_step_equals_one_process(run_ranks):
    n = max(2, GPUS)
    env = {} if GPUS >= 2 else {"TORCH_GPU_PIN": "0"}
    ranks = run_ranks(n, "torch_gpu", "optimizer", env=env, timeout=300)
    check(ranks, n, "nccl" if GPUS >= 2 else "staging")


@pytest.mark.parametrize("n", [1, 2])
def test_horovod_features_on_cuda_tensors(run_ranks, n):
    """Process sets (host staging per set), Adasum (host staging), SyncBatchNorm and join on CUDA."""
    ranks = run_ranks(n, "gpu_features", timeout=300)
    for r in range(n):
        want = ["process_set"] if r % 2 == 0 else []
        want += ["adasum", "sync_batch_norm"] + (["join"] if n > 1 else [])
        assert ranks[r]["ok"] and ranks[r]["checked"] == want, ranks[r]
    assert ranks[0]["path"] == ("nccl" if n == 1 or GPUS >= 2 else "staging")
