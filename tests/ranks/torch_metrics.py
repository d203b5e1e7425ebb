"""Rank program for tests/torch/test_metrics.py: which steps the metrics count.

Usage: torch_metrics.py SOURCES N, SOURCES a comma list of optimizer, commit, explicit: N
iterations, each making one step of every listed source (a DistributedOptimizer step, an
elastic ObjectState commit, appliance.torch.step(samples=4)); ``progress(samples_per_step=2)``
first when "progress" is listed, and ``progress(total=N*10)``. Reports what
appliance.runtime.metrics counts; the last sample goes out at shutdown.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import report  # noqa: E402

import torch  # noqa: E402

import appliance.torch as hvd  # noqa: E402
from appliance.runtime import metrics  # noqa: E402


def main(sources: str, n: int) -> None:
    src = sources.split(",")
    hvd.init()
    if "progress" in src:
        hvd.progress(total=n * 10, samples_per_step=2)
    model = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.ObjectState(epoch=0)
    for i in range(n):
        if "optimizer" in src:
            opt.zero_grad()
            model(torch.ones(3, 4)).sum().backward()
            opt.step()
        if "commit" in src:
            state.epoch = i
            state.commit()
        if "explicit" in src:
            hvd.step(samples=4)
    report({"steps": list(metrics.steps())})
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
