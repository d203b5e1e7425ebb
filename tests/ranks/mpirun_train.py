"""A Horovod training script as users launch it with mpirun (tests/runtime/test_mpirun_lines.py and
tests/launcher/ssh/test_mpirun_ssh.py): ``import horovod.torch as hvd``, an allreduce, a few steps of
SGD under ``hvd.DistributedOptimizer`` with the parameters broadcast from rank 0. It finds the
``horovod`` compatibility package itself (a ``shim/`` beside it or the checkout's), since a remote rank gets only the variables
mpirun's ``-x`` passes. Prints one line ``REPORT {json}`` with the rank's layout and results, its CPU affinity
and NCCL_DEBUG.

Options (the fault tests): ``--die R`` rank R SIGKILLs itself after the first allreduce, and the
others go on allreducing until the runtime reports the job failed (``HOROVOD_ERROR ...`` line, exit 3);
``--hang`` every rank allreduces forever (Ctrl-C tests); ``--elastic`` calls ``hvd.elastic.run``.
"""
import json
import os
import signal
import sys
import time

_here = os.path.dirname(os.path.abspath(__file__))
for _d in (_here, os.path.dirname(_here), os.path.dirname(os.path.dirname(_here))):
    if os.path.isdir(os.path.join(_d, "shim", "horovod")):  # a copy beside a shim/ link, or the checkout's
        sys.path.insert(0, os.path.join(_d, "shim"))
        break

import torch  # noqa: E402

import horovod.torch as hvd  # noqa: E402
from horovod.common.exceptions import HorovodInternalError  # noqa: E402


def say(line: str) -> None:
    """One write per line: under PYTHONUNBUFFERED print() writes the text and its newline apart,
    and mpirun may put another rank's output between them ("UP 0UP 1")."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> int:
    if "--elastic" in sys.argv:
        hvd.init()
        hvd.elastic.run(lambda state: None)(hvd.elastic.ObjectState(epoch=0))
        return 0
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    total = hvd.allreduce(torch.full((4,), float(r + 1)), op=hvd.Sum, name="sum")
    if "--die" in sys.argv and r == int(sys.argv[sys.argv.index("--die") + 1]):
        os.kill(os.getpid(), signal.SIGKILL)
    if "--die" in sys.argv or "--hang" in sys.argv:
        say(f"UP {r}")
        try:
            while True:
                hvd.allreduce(torch.ones(16), name="loop")
                time.sleep(0.01)
        except HorovodInternalError as e:
            say(f"HOROVOD_ERROR rank {r}: {e}")
            return 3
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(100 + r)
    losses = []
    for _ in range(5):
        x = torch.randn(16, 8, generator=gen)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    weights = hvd.allgather_object([round(float(w), 6) for w in model.weight.detach().view(-1)])
    say("REPORT " + json.dumps({
        "rank": r, "size": n, "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "sum": total.tolist(),
        "same_weights": all(w == weights[0] for w in weights), "losses": losses,
        "cpus": sorted(os.sched_getaffinity(0)), "nccl_debug": os.environ.get("NCCL_DEBUG")}))
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
