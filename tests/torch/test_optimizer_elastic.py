"""What a ``DistributedOptimizer`` built at one rank does in an elastic job (HOROVOD_ELASTIC=1, as
the launcher sets it for every elastic worker) and outside one, in one plain process: under
elastic it registers its gradient hooks (so after a growth its first step allreduces, as the new
ranks' do), picks the Adasum delta optimizer, and forms ``groups`` without a collective; without
it, a one-rank optimizer has no hooks, as Horovod's. The growth itself, with real ranks:
``tests/launcher/test_elastic_grow.py``."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fixtures import ROOT

pytest.importorskip("torch")

PROGRAM = r"""
import json, torch
import appliance.torch as hvd
from appliance.torch.adasum_optimizer import DistributedAdasumOptimizer
hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
model(torch.ones(2, 4)).sum().backward()
started = len(opt._handles)
before = [p.detach().clone() for p in model.parameters()]
opt.step()
grouped = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), groups=2)
ada = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                               op=hvd.Adasum)
print(json.dumps({"size": hvd.size(), "hooks": len(opt._grad_accs), "started": started,
                  "stepped": any(not torch.equal(a, p) for a, p in zip(before, model.parameters())),
                  "groups": len(grouped._group_counts), "adasum_delta": isinstance(ada, DistributedAdasumOptimizer)}))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("elastic", [None, "1", "0"])
def test_hooks_at_one_rank_follow_horovod_elastic(elastic):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_", "OMPI_", "PMI"))}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    if elastic is not None:
        env["HOROVOD_ELASTIC"] = elastic  # without APPLIANCE_ELASTIC_ADDR init() is a plain single rank
    proc = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    on = elastic == "1"
    assert got["size"] == 1 and got["stepped"], got
    assert got["hooks"] == (4 if on else 0), got                   # 2 weights + 2 biases
    assert got["started"] == (4 if on else 0), got                 # backward started every allreduce
    assert got["groups"] == (2 if on else 0), got
    assert got["adasum_delta"] is on, got
