"""A Horovod-style training script, unchanged Horovod imports only (tests/hvdcompat/test_horovod_compat.py).

Runs with shim/ on PYTHONPATH (the ``horovod`` compatibility package). Usage:
horovod_script.py [--lose-rank-1]. Checks allreduce (with ``hvd.mpi_ops.Compression.none``), the
autograd Function names, ``handle_average_backwards_compatibility``, ``is_homogeneous``, threads
from ``horovod.runner.util.threads`` running collectives, Adasum (of equal tensors: the tensor),
``hvd.SyncBatchNorm`` (global batch statistics), ``hvd.elastic.run`` with an ``ObjectState`` (synced
from rank 0), a process set of the even ranks, and the timeline (rank 0 reports its tensor names). With
``--lose-rank-1`` rank 1 vanishes (``os._exit(0)``, no shutdown) and the other ranks catch ``horovod.common.exceptions.HorovodInternalError``
from their next allreduce. Reports through ``_report``.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import horovod  # noqa: E402
import horovod.torch as hvd  # noqa: E402
from _report import report  # noqa: E402
from horovod.common.exceptions import HorovodInternalError  # noqa: E402
from horovod.common.util import num_rank_is_power_2  # noqa: E402
from horovod.runner.util.threads import execute_function_multithreaded  # noqa: E402


def main() -> None:
    os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"  # as Horovod's own tests: add_process_set after init
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    data = {"rank": r, "size": n, "version": horovod.__version__, "pow2": num_rank_is_power_2(n)}
    t = torch.full((4,), float(r + 1))
    total = hvd.allreduce(t, op=hvd.Sum, compression=hvd.mpi_ops.Compression.none, name="sum")
    assert torch.equal(total, torch.full((4,), n * (n + 1) / 2)), total
    op = hvd.mpi_ops.handle_average_backwards_compatibility(None, None)
    assert op == hvd.Average
    avg = hvd.allreduce(t, op=op, compression=hvd.Compression.fp16, name="avg")
    assert torch.allclose(avg, torch.full((4,), (n + 1) / 2)), avg
    # Horovod's autograd Function classes with Horovod's apply arguments, forward and backward
    x = torch.full((3,), float(r + 1), requires_grad=True)
    y = hvd.mpi_ops.HorovodAllreduce.apply(x, None, "fn.ar", hvd.Sum, 1.0, 1.0, hvd.global_process_set)
    y.sum().backward()
    assert torch.equal(y.detach(), torch.full((3,), n * (n + 1) / 2)) and torch.equal(x.grad, torch.full((3,), n))
    g = hvd.mpi_ops.HorovodAllgather.apply(x.detach(), "fn.ag", hvd.global_process_set)
    assert torch.equal(g, torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(3)), g
    b = hvd.mpi_ops.HorovodBroadcast.apply(x.detach(), 0, "fn.bc", hvd.global_process_set)
    assert torch.equal(b, torch.ones(3)), b
    data["homogeneous"] = hvd.mpi_ops.is_homogeneous()

    # collectives from several threads, each tensor named (as Horovod requires)
    def reduce_one(i):
        return float(hvd.allreduce(torch.tensor([float(i * (r + 1))]), op=hvd.Sum, name=f"thread.{i}").item())
    got = execute_function_multithreaded(reduce_one, [[i] for i in range(4)])
    data["threads"] = [got[i] for i in range(4)]

    timeline = os.path.join(os.environ["APPLIANCE_TEST_OUT"], "timeline.json")
    hvd.start_timeline(timeline)
    data["adasum"] = hvd.allreduce(torch.full((3,), 2.0), op=hvd.Adasum, name="adasum").tolist()
    # SyncBatchNorm: rank r normalises r + 1 rows of value r with the statistics of every rank
    bn = hvd.SyncBatchNorm(4, momentum=1.0)
    bn(torch.full((r + 1, 4), float(r)))
    data["sbn_running_mean"] = bn.running_mean.tolist()
    data["elastic"] = hvd.elastic.run(lambda state: state.value)(hvd.elastic.ObjectState(value=r))
    # a process set of the even ranks (every rank adds it; only its members use it)
    even = hvd.add_process_set(list(range(0, hvd.size(), 2)))
    if even.included():
        data["even_set"] = hvd.allreduce(torch.full((2,), float(r)), op=hvd.Sum, process_set=even).tolist()
    else:
        data["even_set"] = [float(sum(range(0, hvd.size(), 2)))] * 2
    hvd.remove_process_set(even)
    # the runtime is still usable after those refusals
    hvd.barrier()
    data["after"] = float(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after").item())
    hvd.stop_timeline()
    if r == 0:  # the one rank that writes the timeline
        with open(timeline) as f:
            data["timeline"] = sorted({e["args"]["name"] for e in json.load(f) if e.get("name") == "process_name" and e["pid"]})

    if "--lose-rank-1" in sys.argv:
        if r == 1:
            os._exit(0)  # vanish without shutdown: a lost peer
        try:
            for step in range(200):
                hvd.allreduce(torch.ones(1), name=f"step.{step}")
            data["caught"] = None
        except HorovodInternalError as e:
            data["caught"] = type(e).__module__ + "." + type(e).__name__
    report(data)
    hvd.shutdown()


if __name__ == "__main__":
    main()
