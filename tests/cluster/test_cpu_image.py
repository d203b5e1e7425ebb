"""The CPU image (``bash build.sh --cpu``) runs Horovod's PyTorch examples: torchvision imports and
its C++ ops load (PyPI's only torchvision build needs CUDA torch, so the CPU image carries the same
packages as the GPU image, running on CPU tensors), and a Horovod-style example that uses
torchvision (FakeData, transforms, ResNet-18, DistributedSampler, broadcast, DistributedOptimizer)
trains one step on 2 ranks in one container. Containers are named ``appliance-t<hex>-cpu-*`` and
removed whatever happens; each wait is bounded.
"""
from __future__ import annotations

import json
import secrets

import pytest

from fixtures.docker import run_once

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600, func_only=True)]

EXAMPLE = r"""
import json, math
import torch, torchvision
import torch.nn.functional as F
import horovod.torch as hvd
from torchvision import datasets, models, transforms
hvd.init()
torch.manual_seed(0)
data = datasets.FakeData(size=16, image_size=(3, 32, 32), num_classes=10, transform=transforms.ToTensor())
sampler = torch.utils.data.distributed.DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank())
loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
model = models.resnet18(num_classes=10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
x, y = next(iter(loader))
optimizer.zero_grad()
loss = F.cross_entropy(model(x), y)
loss.backward()
optimizer.step()
boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])
keep = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5)   # a C++ op of torchvision, on CPU
digest = sum(float(p.detach().double().sum()) for p in model.parameters())
print(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "torch": torch.__version__,
                  "torchvision": torchvision.__version__, "loss": float(loss), "nms": keep.tolist(),
                  "digest": digest, "cuda_available": torch.cuda.is_available()}), flush=True)
hvd.shutdown()
"""


def _run(engine, image: str, name: str, command: list[str], timeout: float) -> tuple[int, str]:
    return run_once(engine, image, name, command, timeout, "cpu-image")


def test_torchvision_imports_with_its_ops_in_the_cpu_image(engine, image):
    rc, out = _run(engine, image, f"appliance-t{secrets.token_hex(3)}-cpu-tv",
                   ["python", "-c", "import torch, torchvision, torchvision.extension as e; "
                                    "assert e._has_ops(), 'no C++ ops'; print(torch.__version__, torchvision.__version__)"],
                   timeout=120)
    assert rc == 0, out[-3000:]
    torch_v, tv_v = out.split()[-2:]
    assert torch_v.startswith("2.13.0") and tv_v.startswith("0.28.0"), out


def test_a_horovod_torchvision_example_trains_one_step_on_two_ranks(engine, image):
    rc, out = _run(engine, image, f"appliance-t{secrets.token_hex(3)}-cpu-job",
                   ["appliance", "launch", "-np", "2", "-H", "localhost:2", "--", "python", "-c", EXAMPLE], timeout=300)
    assert rc == 0, out[-4000:]
    reports = {}
    for line in out.splitlines():
        if "<stdout>:{" in line:
            rep = json.loads(line.split("<stdout>:", 1)[1])
            reports[rep["rank"]] = rep
    assert sorted(reports) == [0, 1], out[-4000:]
    for rep in reports.values():
        assert rep["size"] == 2 and rep["nms"] == [0, 2] and rep["torchvision"].startswith("0.28.0"), rep
        assert rep["cuda_available"] is False and 0 < rep["loss"] < 100, rep
    # the averaged step left both ranks with the same model
    assert reports[0]["digest"] == reports[1]["digest"], reports


def test_the_cpu_and_gpu_images_carry_the_same_python_packages(engine, image, gpu_image):
    freeze = ["python", "-m", "pip", "list", "--format=freeze", "--exclude", "appliance"]
    rc_cpu, cpu = _run(engine, image, f"appliance-t{secrets.token_hex(3)}-cpu-pip", freeze, timeout=120)
    rc_gpu, gpu = _run(engine, gpu_image, f"appliance-t{secrets.token_hex(3)}-cpu-pipg", freeze, timeout=120)
    assert rc_cpu == 0 and rc_gpu == 0, (cpu[-2000:], gpu[-2000:])
    assert "torchvision==0.28.0" in cpu.split(), cpu
    assert sorted(cpu.split()) == sorted(gpu.split())
    env = dict(e.split("=", 1) for e in engine.images.get(image).attrs["Config"]["Env"])
    assert "NVIDIA_VISIBLE_DEVICES" not in env and engine.images.get(image).labels.get("appliance.variant") == "cpu"
