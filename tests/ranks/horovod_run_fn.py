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
