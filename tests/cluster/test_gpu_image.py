"""The GPU image (``bash build.sh``, no flags) on a machine without a GPU: a 2-rank job in one
container with CPU tensors, and what the image holds for GPU hosts (PyPI's CUDA 13 torch and
torchvision, NCCL as a wheel, the NVIDIA container toolkit's env).

One container runs ``appliance launch -np 2 -H localhost:2 -- python -c JOB``; every rank prints one
JSON line (versions, its allreduce results, ``appliance.runtime.engine.capabilities()``), which the
tests below read from the prefixed output. Containers are named ``appliance-t<hex>-gpu-*`` and
removed whatever happens; each wait is bounded.
"""
from __future__ import annotations

import json
import secrets

import pytest

from fixtures.docker import run_once

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]

JOB = r"""
import importlib.util, json, sys
import torch, torchvision
import horovod.torch as hvd
import appliance.runtime.engine as engine
hvd.init()
r, n = hvd.rank(), hvd.size()
x = torch.arange(6, dtype=torch.float32) + 10 * r   # CPU tensor, different on every rank
total = hvd.allreduce(x, op=hvd.Sum, name="sum")
mean = hvd.allreduce(x, name="mean")                # Horovod's default: average
caps = engine.capabilities()
print(json.dumps({"rank": r, "size": n, "torch": torch.__version__, "torchvision": torchvision.__version__,
                  "cuda_available": torch.cuda.is_available(), "nvml": importlib.util.find_spec("pynvml") is not None, "sum": total.tolist(), "mean": mean.tolist(),
                  "caps": dict(caps)}, default=str), flush=True)
hvd.shutdown()
"""


def _run(engine, image: str, name: str, command: list[str], timeout: float) -> tuple[int, str]:
    return run_once(engine, image, name, command, timeout, "gpu-image")


@pytest.fixture(scope="module")
def job(engine, gpu_image):
    """The 2-rank job, run once for the module: (exit code, output, per-rank reports)."""
    name = f"appliance-t{secrets.token_hex(3)}-gpu-job"
    rc, out = _run(engine, gpu_image, name,
                   ["appliance", "launch", "-np", "2", "-H", "localhost:2", "--", "python", "-c", JOB], timeout=240)
    reports = {}
    for line in out.splitlines():
        if "<stdout>:{" in line:
            rep = json.loads(line.split("<stdout>:", 1)[1])
            reports[rep["rank"]] = rep
    return rc, out, reports


def test_two_rank_job_runs_with_cpu_tensors(job):
    rc, out, reports = job
    assert rc == 0, out[-4000:]
    assert sorted(reports) == [0, 1], out[-4000:]
    want_sum = [float(2 * i + 10) for i in range(6)]          # (i) + (i + 10)
    for r, rep in reports.items():
        assert rep["size"] == 2
        assert rep["sum"] == want_sum, rep
        assert rep["mean"] == [v / 2 for v in want_sum], rep
        # PyPI's CUDA 13.0 build of torch, and the torchvision built against it, import without a GPU.
        assert rep["torch"].endswith("+cu130"), rep["torch"]
        assert rep["torchvision"].startswith("0.28.0") and "+cu130" in rep["torchvision"], rep["torchvision"]
        assert {"cuda", "nccl"} <= set(rep["caps"]), rep["caps"]
        assert rep["nvml"], "no pynvml: torch.cuda.utilization() and the view's GPU column would read nothing"


def test_capabilities_report_the_nccl_wheel(job):
    """The runtime sees the NCCL that the nvidia-nccl-cu13 wheel brings (2.29.7 -> 22907), on both ranks."""
    rc, out, reports = job
    assert rc == 0 and sorted(reports) == [0, 1], out[-4000:]
    for r, rep in reports.items():
        caps = rep["caps"]
        version = caps.get("nccl_version")
        assert isinstance(version, int) and version > 0, f"rank {r}: capabilities() = {caps}"
        # found as the wheel next to torch, first in the search order
        assert caps["nccl_library"].endswith("/site-packages/nvidia/nccl/lib/libnccl.so.2"), caps
        # loaded is not runnable: without a GPU nothing runs through NCCL, and it says why
        assert caps["nccl"] is False and "no device" in caps["why"], caps


def test_cuda_simply_unavailable_without_a_gpu(engine, job):
    rc, out, reports = job
    if "nvidia" in (engine.info().get("Runtimes") or {}):
        pytest.skip("this engine has an nvidia runtime; the job ran without --gpus all anyway")
    assert [reports[r]["cuda_available"] for r in (0, 1)] == [False, False]
    assert [reports[r]["caps"]["cuda"] for r in (0, 1)] == [False, False]


def test_image_holds_nccl_and_the_toolkit_env(engine, gpu_image):
    name = f"appliance-t{secrets.token_hex(3)}-gpu-find"
    rc, out = _run(engine, gpu_image, name, ["/bin/sh", "-c",
                   "find /opt/venv/lib/python3*/site-packages/nvidia/nccl/lib -name 'libnccl.so.2*'; "
                   "ldconfig -p | grep -E 'libnccl.so.2 |libcudart.so.13 '; "
                   "test ! -e /wheelhouse; ! command -v cc c++ gcc g++ cmake"], timeout=60)
    assert rc == 0, out
    found = out.splitlines()
    assert any(l.endswith("/site-packages/nvidia/nccl/lib/libnccl.so.2") for l in found), out
    assert any("libcudart.so.13 " in l for l in found), out                  # the loader finds both by name
    env = dict(e.split("=", 1) for e in engine.images.get(gpu_image).attrs["Config"]["Env"])
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "all"
    assert env.get("NVIDIA_DRIVER_CAPABILITIES") == "compute,utility"
    assert engine.images.get(gpu_image).labels.get("appliance.variant") == "gpu"
