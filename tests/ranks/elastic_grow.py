"""Rank program for the grow-from-one-rank tests (tests/launcher/test_elastic_grow.py and
ssh/test_elastic_grow_ssh.py): a Horovod elastic script as Horovod's examples write it, unchanged
Horovod imports only (``shim/`` on PYTHONPATH), ``DistributedOptimizer`` built once before
``hvd.elastic.run`` at whatever size the job has then, a ``TorchState`` and a commit every step.

Every rank starts from its own random model (seed 1234 + rank), so only the state's sync makes
the ranks agree. Step s of rank r trains on a batch drawn from seed 1000·s + r, so the committed
training is a pure function of the sizes its steps ran at: ``replay(sizes)`` recomputes it in one
process from rank 0's first model.

Usage: elastic_grow.py OUT STEPS [STEP_S] [top] [check] [slow] [adasum]. ``adasum``: the
optimizer combines with ``op=hvd.Adasum`` (no replay: that is not a mean). ``slow``: after ``hvd.init()`` the
worker writes ``inited.W`` and takes 4 s before it builds its model (a big model's set-up). ``top``: the script also calls
``hvd.broadcast_parameters`` before ``hvd.elastic.run`` (what Horovod's elastic docs forbid);
``check``: every step also allgathers the sum of the parameters and raises if the ranks differ.
``OUT/stop`` (a step number): every rank finishes after that step instead of STEPS. Evidence per
worker W (APPLIANCE_ELASTIC_WORKER): ``pid.W``; ``log.W``, one JSON line per step (step, size,
rank, the sum of the model's parameters after the step, HOROVOD_ELASTIC, the time); ``done.W`` at the end
(sizes, parameters). Every step also prints ``step S size N rank R sum X``.
"""
import json
import os
import sys
import time

import torch

LR, MOMENTUM = 0.05, 0.9


def model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=g, dtype=torch.float32)
    return x, x.sum(1, keepdim=True).sin()


def replay(sizes):
    """The same training in one process: at step s, the mean of the gradients of ranks 0..n-1."""
    model, opt = model_and_optimizer(1234)
    for step, n in enumerate(sizes, start=1):
        opt.zero_grad()
        loss = sum(((model(x) - y) ** 2).mean() for x, y in (batch(step, r) for r in range(n))) / n
        loss.backward()
        opt.step()
    return model


def checksum(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def main():
    import horovod.torch as hvd

    out, steps = sys.argv[1], int(sys.argv[2])
    step_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
    top, check, slow = "top" in sys.argv[4:], "check" in sys.argv[4:], "slow" in sys.argv[4:]
    op = hvd.Adasum if "adasum" in sys.argv[4:] else hvd.Average
    wid = os.environ.get("APPLIANCE_ELASTIC_WORKER", "x")

    def write(name, data):
        tmp = os.path.join(out, f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write(data)
        os.replace(tmp, os.path.join(out, name))

    def stop_at() -> int:
        try:
            with open(os.path.join(out, "stop")) as f:
                return int(f.read().strip() or steps)
        except (OSError, ValueError):
            return steps

    write(f"pid.{wid}", str(os.getpid()))
    hvd.init()
    if slow:
        write(f"inited.{wid}", str(hvd.size()))
        time.sleep(4.0)
    model, opt = model_and_optimizer(1234 + hvd.rank())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=op)
    if top:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0, sizes=[])
    log = open(os.path.join(out, f"log.{wid}"), "a")

    @hvd.elastic.run
    def train(state):
        while state.step < min(steps, stop_at()):
            step = state.step + 1
            x, y = batch(step, hvd.rank())
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            state.sizes = state.sizes + [hvd.size()]
            state.step = step
            total = checksum(model)
            if check:
                everyone = hvd.allgather(torch.tensor([total], dtype=torch.float64), name="check").tolist()
                if max(everyone) - min(everyone) > 1e-9 * max(1.0, abs(total)):
                    raise RuntimeError(f"step {step}: the ranks hold different models: {everyone}")
            log.write(json.dumps({"step": step, "size": hvd.size(), "rank": hvd.rank(), "sum": total,
                                  "elastic": os.environ.get("HOROVOD_ELASTIC"), "t": time.time()}) + "\n")
            log.flush()
            print(f"step {step} size {hvd.size()} rank {hvd.rank()} sum {total:+.9f}", flush=True)
            time.sleep(step_s)
            state.commit()

    train(state)
    write(f"done.{wid}", json.dumps({"rank": hvd.rank(), "size": hvd.size(), "sizes": state.sizes,
                                     "params": [p.detach().flatten().tolist() for p in model.parameters()]}))
    hvd.shutdown()


if __name__ == "__main__":
    main()
