"""Rank program for the model-equivalence test (tests/torch/test_elastic.py): a small PyTorch
model trained the elastic way (``hvd.elastic.run``, ``TorchState`` with the model, a momentum
optimizer under ``DistributedOptimizer`` and the list of sizes every committed step ran at).
Step s of rank r trains on a batch drawn from seed 1000·s + r, so the committed training is a pure
function of the sizes: ``replay(sizes)`` recomputes it in one process.

Usage: elastic_torch.py OUT STEPS COMMIT STEP_S. ``kill.W`` in OUT (a step number): worker W
SIGKILLs itself there. Evidence: ``pid.W``, ``step.W`` (JSON rank, size, step), and from the final
rank 0 ``result.json`` (sizes and the model's parameters).
"""
import json
import os
import signal
import sys
import time

import torch

LR, MOMENTUM = 0.05, 0.9


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=g, dtype=torch.float32)
    return x, x.sum(1, keepdim=True).sin()


def replay(sizes):
    """The same training in one process: at step s, the mean of the gradients of ranks 0..n-1."""
    model, opt = model_and_optimizer()
    for step, n in enumerate(sizes, start=1):
        opt.zero_grad()
        loss = sum(((model(x) - y) ** 2).mean() for x, y in (batch(step, r) for r in range(n))) / n
        loss.backward()
        opt.step()
    return model


def main():
    import appliance.torch as hvd

    OUT, STEPS, COMMIT, STEP_S = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    wid = int(os.environ.get("APPLIANCE_ELASTIC_WORKER", "0"))

    def write(name, data):
        tmp = os.path.join(OUT, f".{name}.tmp.{wid}")
        with open(tmp, "w") as f:
            f.write(data)
        os.replace(tmp, os.path.join(OUT, name))

    write(f"pid.{wid}", str(os.getpid()))
    hvd.init()
    model, opt = model_and_optimizer()
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0, sizes=[])

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            step = state.step + 1
            kill = os.path.join(OUT, f"kill.{wid}")
            if os.path.exists(kill) and open(kill).read().strip() == str(step):
                os.kill(os.getpid(), signal.SIGKILL)
            x, y = batch(step, hvd.rank())
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            state.sizes = state.sizes + [hvd.size()]
            state.step = step
            write(f"step.{wid}", json.dumps({"rank": hvd.rank(), "size": hvd.size(), "step": step}))
            if step % COMMIT == 0:
                state.commit()
            time.sleep(STEP_S)

    train(state)
    if hvd.rank() == 0:
        write("result.json", json.dumps({"sizes": state.sizes,
                                         "params": [p.detach().flatten().tolist() for p in model.parameters()]}))
    hvd.shutdown()


if __name__ == "__main__":
    main()
