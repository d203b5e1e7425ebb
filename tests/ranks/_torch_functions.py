"""Worker bodies: broadcast_parameters / optimizer state / objects, allgather_object, the
lifecycle (init -> shutdown -> init), and the build probes."""
from __future__ import annotations

import torch

from _torch_common import check, expect_raises


def _model(seed: int) -> torch.nn.Module:
    """Parameters and buffers (BatchNorm's, with the int64 scalar num_batches_tracked) that
    follow from ``seed``."""
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7), torch.nn.ReLU(), torch.nn.Linear(7, 2))
    bn = m[1]
    bn.running_mean.fill_(seed)
    bn.running_var.fill_(seed + 1)
    bn.num_batches_tracked.fill_(seed)
    return m


def _trained_adam(seed: int, steps: int, lr: float):
    """A model and an Adam optimizer after ``steps`` steps: reproducible from its arguments."""
    model = _model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.8, 0.9 + seed / 1000))
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 5, generator=g)).square().mean().backward()
        opt.step()
    return model, opt


def _same_state(a: torch.optim.Optimizer, b: torch.optim.Optimizer, what: str) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["state"].keys() == sb["state"].keys(), what
    for pid in sa["state"]:
        for key, va in sa["state"][pid].items():
            vb = sb["state"][pid][key]
            if torch.is_tensor(va):
                check(vb, va, f"{what}: state[{pid}][{key}]")
            else:
                assert va == vb, f"{what}: state[{pid}][{key}] {vb!r} != {va!r}"
    for ga, gb in zip(sa["param_groups"], sb["param_groups"]):
        assert ga == gb, f"{what}: param_groups {gb} != {ga}"


def functions(hvd):
    P, r = hvd.size(), hvd.rank()
    for root in range(P):
        # state_dict: parameters and buffers
        model = _model(100 + r)
        hvd.broadcast_parameters(model.state_dict(), root_rank=root)
        for (k, v), (_, w) in zip(sorted(model.state_dict().items()), sorted(_model(100 + root).state_dict().items())):
            check(v, w, f"broadcast_parameters(state_dict) root {root}: {k}")
        # named_parameters() generator, and parameters() list
        model = _model(200 + r)
        hvd.broadcast_parameters(model.named_parameters(), root_rank=root)
        for (k, v), w in zip(model.named_parameters(), _model(200 + root).parameters()):
            check(v.detach(), w.detach(), f"broadcast_parameters(named_parameters) root {root}: {k}")
        model = _model(300 + r)
        hvd.broadcast_parameters(list(model.parameters()), root_rank=root)
        for v, w in zip(model.parameters(), _model(300 + root).parameters()):
            check(v.detach(), w.detach(), f"broadcast_parameters(parameters) root {root}")

        # optimizer state: tensors, scalars in state and param_groups (lr, betas), all from root
        _, opt = _trained_adam(10 + r, steps=r + 1, lr=0.001 * (r + 1))
        hvd.broadcast_optimizer_state(opt, root_rank=root)
        _, ref = _trained_adam(10 + root, steps=root + 1, lr=0.001 * (root + 1))
        _same_state(ref, opt, f"broadcast_optimizer_state root {root}")
        assert opt.param_groups[0]["lr"] == 0.001 * (root + 1)

        # an optimizer that has not stepped yet gets its state created first
        if r == root:
            model, fresh = _trained_adam(20, steps=2, lr=0.01)
        else:
            model = _model(20)
            fresh = torch.optim.Adam(model.parameters(), lr=0.5)
        hvd.broadcast_optimizer_state(fresh, root_rank=root)
        _same_state(_trained_adam(20, steps=2, lr=0.01)[1], fresh, "optimizer without state")
        # ... also inside a DistributedOptimizer (whose state starts empty, as in Horovod),
        # without an allreduce that only some ranks would join
        model = _model(30)
        dopt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1 * (r + 1)),
                                        named_parameters=model.named_parameters())
        hvd.broadcast_optimizer_state(dopt, root_rank=root)
        assert dopt.param_groups[0]["lr"] == 0.1 * (root + 1)
        assert all(float(s["step"]) == 1 for s in dopt.state.values()) and len(dopt.state) == 6

        # objects; without a name, ranks may pass objects of different types
        obj = {"root": root, "t": torch.arange(3), "f": (lambda v: v * 2)} if r == root else None
        got = hvd.broadcast_object(obj, root_rank=root)
        assert got["root"] == root and torch.equal(got["t"], torch.arange(3)) and got["f"](4) == 8
        assert hvd.broadcast_object(list(range(r + 1)), root, name="named") == list(range(root + 1))

    # a stateless optimizer: nothing to broadcast, and no hang
    sgd = torch.optim.SGD(_model(1).parameters(), lr=0.1)
    hvd.broadcast_optimizer_state(sgd, 0)
    expect_raises(ValueError, lambda: hvd.broadcast_optimizer_state(
        torch.optim.LBFGS(_model(1).parameters()), 0), "LBFGS")

    objs = hvd.allgather_object({"rank": r, "blob": "x" * (1000 * r)})
    assert [o["rank"] for o in objs] == list(range(P)) and [len(o["blob"]) for o in objs] == [1000 * p for p in
                                                                                            range(P)]
    assert hvd.allgather_object(r * 10, name="ints") == [p * 10 for p in range(P)]


def probes(hvd):
    from appliance.runtime import engine

    caps = engine.capabilities()
    assert hvd.mpi_built() is False and hvd.mpi_enabled() is False
    assert hvd.gloo_built() is False and hvd.gloo_enabled() is False
    assert hvd.ddl_built() is False and hvd.ccl_built() is False and hvd.rocm_built() is False
    assert hvd.cuda_built() == bool(caps["cuda"])
    assert bool(hvd.nccl_built()) == bool(caps["nccl"])
    expect_raises(ValueError, hvd.mpi_threads_supported, "mpi_threads_supported without MPI")
    assert hvd.is_initialized()
    P, r = hvd.size(), hvd.rank()
    bad = "/nonexistent-dir/timeline.json"  # rank 0 writes the timeline and refuses it; others do nothing
    if r == 0:
        expect_raises(ValueError, lambda: hvd.start_timeline(bad), "timeline on an unwritable path")
    else:
        hvd.start_timeline(bad)
    hvd.stop_timeline()
    assert 0 <= r < P and hvd.local_size() == P and hvd.local_rank() == r
    assert hvd.cross_size() == 1 and hvd.cross_rank() == 0


def lifecycle(hvd):
    """init -> shutdown -> init, with the collectives working again; init is idempotent,
    init(comm=...) accepts exactly the global set, add_process_set needs dynamic sets."""
    P, r = hvd.size(), hvd.rank()
    hvd.init()  # a second init is a no-op
    hvd.init(comm=list(range(P)), process_sets=[hvd.global_process_set])
    check(hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.full((3,), float(P)), "before shutdown")
    hvd.barrier()
    hvd.shutdown()
    assert not hvd.is_initialized()
    expect_raises(ValueError, hvd.size, "size() after shutdown")
    expect_raises(ValueError, lambda: hvd.allreduce(torch.ones(1)), "allreduce after shutdown")
    hvd.shutdown()  # idempotent
    hvd.init()
    assert hvd.size() == P and hvd.rank() == r
    check(hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.full((3,), float(P)), "after init again")
    if P > 1:
        hvd.shutdown()
        expect_raises(NotImplementedError, lambda: hvd.init(comm=[0]), "init(comm=[0])")
        assert not hvd.is_initialized(), "a refused init leaves nothing behind"
        hvd.init()
        # dynamic process sets are off unless asked for (as in Horovod)
        expect_raises(ValueError, lambda: hvd.add_process_set([0]), "HOROVOD_DYNAMIC_PROCESS_SETS")
    check(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(P)), "at the end")


def peer_loss(hvd):
    """The last rank dies abruptly after a first allreduce; every other rank's next collective
    must fail with HorovodInternalError naming it, within seconds, instead of hanging."""
    import os
    import signal
    import time

    P, r = hvd.size(), hvd.rank()
    hvd.allreduce(torch.ones(1), name="everyone.up")
    if r == P - 1:
        with open(os.path.join(os.environ["APPLIANCE_TEST_OUT"], "victim_died_at"), "w") as f:
            f.write(repr(time.time()))
        os._exit(3)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # report even while the launcher stops us
    try:
        hvd.allreduce(torch.ones(4), name="after.loss")
    except hvd.HorovodInternalError as e:
        return {"error": str(e), "origin_rank": e.origin_rank, "at": time.time()}
    return {"error": None}


CASES = {"functions": functions, "probes": probes, "lifecycle": lifecycle,
         "peer_loss": peer_loss}
