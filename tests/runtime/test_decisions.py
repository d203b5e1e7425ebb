"""The device decisions as pure logic (backends/cuda/device_plan.h through _core_testing):
NCCL or host staging for the whole job, and per entry; the scalar NCCL applies on the device."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from appliance.runtime import _core_testing as T
from appliance.runtime.engine import Average, DType, Kind, Max, Min, Product, Sum

GOOD = 22907


def rank(host="a", machine="m1", gpu="0000:01:00.0", nccl=GOOD, why=""):
    return (host, machine, gpu, nccl, why)


def test_nccl_when_every_rank_can():
    assert T.decide_cuda_path([rank(gpu="g0"), rank(gpu="g1"), rank("b", "m2", "g0")]) == ("nccl", "")


def test_two_ranks_on_one_gpu_stage_and_are_named():
    path, why = T.decide_cuda_path([rank(gpu="g0"), rank(gpu="g1"), rank(gpu="g0")])
    assert path == "staging"
    assert "ranks 0 and 2 share one GPU (g0 on host a)" in why and "set_device" in why


def test_same_bus_id_on_two_machines_is_two_gpus():
    assert T.decide_cuda_path([rank(machine="m1"), rank("b", machine="m2")])[0] == "nccl"


def test_a_rank_without_nccl_moves_the_job_to_staging_and_is_named():
    path, why = T.decide_cuda_path([rank(gpu="g0"), rank("b", "m2", nccl=0, why="no NCCL library found")])
    assert path == "staging" and why == "rank 1 (b) cannot use NCCL: no NCCL library found"


def test_nccl_versions_must_agree_in_major_minor():
    assert T.decide_cuda_path([rank(gpu="g0"), rank(gpu="g1", nccl=22905)])[0] == "nccl"
    path, why = T.decide_cuda_path([rank(gpu="g0"), rank("b", "m2", nccl=22103)])
    assert path == "staging" and "rank 0 (a) has 2.29.7, rank 1 (b) has 2.21.3" in why


FLOATS = [DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64]


@pytest.mark.parametrize("kind", [Kind.ALLREDUCE, Kind.REDUCESCATTER])
def test_reductions_nccl_has(kind):
    for dt in FLOATS + [DType.UINT8, DType.INT8, DType.INT32, DType.INT64]:
        for op in (Sum, Min, Max, Product):
            assert T.select_cuda_backend(kind, dt, op, 1.0, 1.0) == ("nccl", ""), (dt, op)
    for dt in FLOATS:
        assert T.select_cuda_backend(kind, dt, Average, 1.0, 1.0)[0] == "nccl"
        assert T.select_cuda_backend(kind, dt, Sum, 0.5, 3.0)[0] == "nccl"
        assert T.select_cuda_backend(kind, dt, Average, 2.0, 1.0)[0] == "nccl"


@pytest.mark.parametrize("kind", [Kind.ALLREDUCE, Kind.REDUCESCATTER])
def test_reductions_nccl_lacks_are_staged_with_a_reason(kind):
    assert T.select_cuda_backend(kind, DType.INT16, Sum, 1.0, 1.0) == ("staging", "NCCL has no int16 reductions")
    assert T.select_cuda_backend(kind, DType.BOOL, Max, 1.0, 1.0)[0] == "staging"
    path, why = T.select_cuda_backend(kind, DType.FLOAT32, Min, 2.0, 1.0)
    assert path == "staging" and "Min" in why
    assert T.select_cuda_backend(kind, DType.INT32, Average, 1.0, 1.0)[0] == "staging"
    assert T.select_cuda_backend(kind, DType.INT64, Sum, 1.0, 0.5)[0] == "staging"


@pytest.mark.parametrize("kind", [Kind.ALLREDUCE, Kind.REDUCESCATTER])
def test_scaled_sums_of_a_lone_rank_are_staged(kind):
    # NCCL 2.28.9's one-rank PreMulSum leaves the last element unscaled for some sizes (seen on an H100)
    for dt in FLOATS:
        path, why = T.select_cuda_backend(kind, dt, Sum, 0.5, 1.0, size=1)
        assert path == "staging" and "one rank" in why
        assert T.select_cuda_backend(kind, dt, Average, 1.0, 2.0, size=1)[0] == "staging"
        # Average of one rank without scales is a copy: it stays on NCCL
        assert T.select_cuda_backend(kind, dt, Average, 1.0, 1.0, size=1) == ("nccl", "")
        assert T.select_cuda_backend(kind, dt, Sum, 1.0, 1.0, size=1) == ("nccl", "")


def test_data_movement_runs_on_nccl_for_every_dtype():
    for kind in (Kind.ALLGATHER, Kind.BROADCAST, Kind.ALLTOALL):
        for dt in DType:
            assert T.select_cuda_backend(kind, dt, Sum, 1.0, 1.0) == ("nccl", "")


def test_premul_factor_folds_scales_and_average():
    assert T.nccl_premul_factor(Sum, 1.0, 1.0, 4) == 1.0
    assert T.nccl_premul_factor(Sum, 0.5, 3.0, 4) == 1.5
    assert T.nccl_premul_factor(Average, 2.0, 1.0, 4) == 0.5


def test_scalar_bits_match_numpy_and_torch():
    values = [0.0, -0.0, 1.0, -2.5, 0.1, 1 / 3, 65504.0, 70000.0, 6e-8, 1e-5, float("inf"), -float("inf")]
    for v in values:
        with np.errstate(over="ignore"):
            want = int(np.array(v, dtype=np.float16).view(np.uint16))
        assert T.float_to_half_bits(v) == want, v
        assert T.float_to_bf16_bits(v) == int(torch.tensor(v, dtype=torch.bfloat16).view(torch.int16)) & 0xFFFF, v
    assert T.float_to_half_bits(float("nan")) & 0x7C00 == 0x7C00
