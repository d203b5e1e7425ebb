"""A module-level function for ``horovod.run`` (tests/hvdcompat/test_horovod_compat.py): the
workers unpickle it by reference, so it must live in a module on their path."""


def rank_and_sum(scale):
    import torch

    import horovod.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="run.sum")
    out = (hvd.rank(), hvd.size(), float(total.item()) * scale)
    hvd.shutdown()
    return out


def fail_on_rank_1():
    import horovod.torch as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise RuntimeError("rank 1 fails on purpose")
    hvd.shutdown()
    return "ok"


def elastic_sum():
    """Under an elastic horovod.run: the worker that starts as rank 2 dies at the first step; the
    others go on at 2 ranks and return (rank, size, the sum of ranks+1) of their last round."""
    import os

    import torch

    import horovod.torch as hvd
    hvd.init()
    state = hvd.elastic.ObjectState(step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < 3:
            if os.environ.get("APPLIANCE_ELASTIC_WORKER") == "2":
                os._exit(1)
            total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="run.elastic")
            state.step += 1
            state.commit()
        return float(total.item())

    total = train(state)
    out = (hvd.rank(), hvd.size(), total)
    hvd.shutdown()
    return out
