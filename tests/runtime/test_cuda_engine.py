"""The engine's CUDA path end to end with real ranks over real sockets, on the stand-in CUDA
runtime (device memory is host memory): the job-wide NCCL/staging decision made through the
store, host staging of every collective, an NCCL that fails ending the job on every rank, and
the NCCL backend's plumbing at one rank (on a stand-in NCCL whose one-rank collectives are
copies)."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("np_", [2, 3])
def test_ranks_sharing_one_gpu_go_through_host_memory(run_ranks, fake_libs, np_):
    env = {"FAKE_CUDART": fake_libs["cudart"], "APPLIANCE_NCCL_LIBRARY": fake_libs["nccl"],
           "APPLIANCE_CHUNK_BYTES": "4096"}
    ranks = run_ranks(np_, "fake_cuda", "staging", env=env, timeout=90)
    names = " and ".join(str(r) for r in range(np_)) if np_ == 2 else "0, 1 and 2"
    for r in range(np_):
        assert ranks[r].get("ok"), ranks[r]
        assert ranks[r]["checked"] == 16
        path, why = ranks[r]["cuda_path"]
        assert path == "staging" and f"ranks {names} share one GPU" in why
    # The warning is printed once per reason, by each rank, on stderr.
    warn = "warning: CUDA tensors go through host memory: ranks"
    assert sum(warn in line for line in ranks.output(stream="stderr").splitlines()) == np_
    assert ranks.output().count("NCCL has no int16 reductions") == 0  # covered by the job-wide reason


def test_a_rank_whose_nccl_is_too_old_moves_the_job_to_staging(run_ranks, fake_libs):
    env = {"FAKE_CUDART": fake_libs["cudart"], "APPLIANCE_NCCL_LIBRARY": fake_libs["nccl_old"],
           "FAKE_DISTINCT_GPUS": "1"}
    ranks = run_ranks(2, "fake_cuda", "staging", env=env, timeout=90)
    for r in range(2):
        assert ranks[r].get("ok"), ranks[r]
        path, why = ranks[r]["cuda_path"]
        assert path == "staging" and why.startswith("rank 0 (") and "NCCL 2.7.8" in why


def test_an_nccl_that_fails_ends_the_job_on_every_rank(run_ranks, fake_libs):
    env = {"FAKE_CUDART": fake_libs["cudart"], "APPLIANCE_NCCL_LIBRARY": fake_libs["nccl"],
           "FAKE_DISTINCT_GPUS": "1"}
    ranks = run_ranks(2, "fake_cuda", "nccl_fails", env=env, timeout=60)
    for r in range(2):
        assert "ok" not in ranks[r], ranks[r]
        assert "ncclCommInitRank failed: fake NCCL: no GPU here" in ranks[r]["error"]
        assert ranks[r]["error_after_s"] < 5


def test_one_rank_runs_every_kind_through_the_nccl_backend(run_ranks, fake_libs):
    # Device work "takes" 2000 event queries (~0.1 s), so waits on a stream return before it is done.
    env = {"FAKE_CUDART": fake_libs["cudart"], "APPLIANCE_NCCL_LIBRARY": fake_libs["nccl_solo"],
           "FAKE_CUDA_EVENT_POLLS": "2000"}
    ranks = run_ranks(1, "fake_cuda", "solo", env=env, timeout=60)
    assert ranks[0].get("ok"), ranks[0]
    assert ranks[0]["checked"] == 14 and ranks[0]["cuda_path"] == ["nccl", ""]
    # the 4 ops waited for on stream 0 through NCCL were each ordered by a stream wait, not a
    # host wait (the fused batch is waited for on the host; the int16 op, and the scaled sums of
    # this one-rank job, stage on the host), plus the fusion buffer's own ordering before each
    # fused entry
    fused = ranks[0]["fused_entries"]  # the batch fuses into one entry or a few, as it arrives
    assert ranks[0]["stream_waits"] == 4 + fused, ranks[0]
    # shutdown right after a stream-ordered op let all device work finish before the teardown:
    # only the fusion buffer's event records (never queried, only waited on) are left
    assert ranks[0]["events_outstanding"] == fused, ranks[0]
    # the one int16 reduction went through host memory, and said so once
    assert ranks.output(stream="stderr").count("go through host memory: NCCL has no int16 reductions") == 1
    assert ranks.output(stream="stderr").count("go through host memory: NCCL has no Adasum") == 1
    assert ranks.output(stream="stderr").count("go through host memory: a scaled sum on one rank") == 1
