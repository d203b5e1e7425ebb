"""Worker for tests/torch/test_elastic.py: ``hvd.elastic`` on real ranks.

Usage: elastic_worker.py <case>[,<case>...]. Cases:
  restore        a HorovodInternalError raised inside ``hvd.elastic.run`` restores model, optimizer
                 and counters to the last commit and leaves ``run``; no reset callback runs.
  hosts_updated  rank 0 alone is told of new hosts; the next ``commit`` raises HostsUpdatedInterrupt
                 on every rank, ``run`` re-initialises the runtime, calls the reset callbacks and
                 ``func`` again after syncing rank 0's state (for a removal, ``skip_sync``, without);
                 a DistributedOptimizer made before the reset still averages gradients after it.
  object_sync    ``ObjectState`` and ``TorchState`` start different on every rank; ``run`` makes
                 everyone's equal to rank 0's.
  sampler        ``ElasticSampler``: the partition covers the dataset, recorded batches are skipped
                 after a restore (also when recorded per rank with ``record_indices`` and merged by
                 the sync), ``set_epoch`` starts over.
  lost_rank      the last rank dies after the first commit; every other rank's ``run`` restores the
                 committed state and raises HorovodInternalError (reported with the state).
Reports ``{"ok", "rank", "size", "cases", ...}`` via ``_report``.
"""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import appliance.torch as hvd  # noqa: E402
from _report import report  # noqa: E402
from appliance.hvdcompat.exceptions import HostsUpdatedInterrupt  # noqa: E402


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1))


def _snapshot(model, opt):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {pid: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
             for pid, s in opt.state_dict()["state"].items()})


def _same(a, b, what):
    (ma, oa), (mb, ob) = a, b
    for k in ma:
        assert torch.equal(ma[k], mb[k]), f"{what}: model {k} differs"
    assert oa.keys() == ob.keys(), f"{what}: optimizer state keys {oa.keys()} != {ob.keys()}"
    for pid in oa:
        for k in oa[pid]:
            va, vb = oa[pid][k], ob[pid][k]
            assert torch.equal(va, vb) if torch.is_tensor(va) else va == vb, f"{what}: optimizer {pid}.{k}"


def _differs(a, b) -> bool:
    try:
        _same(a, b, "")
    except AssertionError:
        return True
    return False


def _train_step(model, opt, step):
    g = torch.Generator().manual_seed(1000 * hvd.rank() + step)
    opt.zero_grad()
    model(torch.randn(6, 4, generator=g)).square().mean().backward()
    opt.step()


def restore():
    model = _model(1)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, batch=0, history=[])
    resets = []
    state.register_reset_callbacks([lambda: resets.append(1)])
    seen = {}

    @hvd.elastic.run
    def train(state):
        for step in range(state.batch, 6):
            _train_step(model, opt, step)
            state.batch = step + 1
            state.history.append(step)
            if state.batch == 3:
                state.commit()
                seen["committed"] = _snapshot(model, opt)
        seen["before"] = _snapshot(model, opt)
        raise hvd.HorovodInternalError("raised by the test")

    try:
        train(state)
        raise AssertionError("HorovodInternalError did not leave hvd.elastic.run")
    except hvd.HorovodInternalError as e:
        assert str(e) == "raised by the test", e
    assert state.batch == 3 and state.history == [0, 1, 2], (state.batch, state.history)
    _same(_snapshot(model, opt), seen["committed"], "after restore")
    assert _differs(seen["before"], seen["committed"]), "the uncommitted steps changed nothing"
    assert resets == [], "a reset callback ran although the job was not reset"
    # the runtime is still usable and the state can go on from its commit
    _train_step(model, opt, 99)
    return {"restore_batch": state.batch}


def hosts_updated():
    P, r = hvd.size(), hvd.rank()
    out = {}
    model = _model(4)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    _train_step(model, opt, 0)
    for kind in (hvd.elastic.HostUpdateResult.added, hvd.elastic.HostUpdateResult.removed):
        state = hvd.elastic.ObjectState(tag="start", commits=0)
        resets, calls = [], []
        state.register_reset_callbacks([lambda: resets.append(hvd.size())])

        @hvd.elastic.run
        def train(state, kind):
            calls.append(state.tag)
            if len(calls) == 1:
                state.commit()  # nothing queued yet: no interrupt
                if r == 0:
                    state.on_hosts_updated(1, kind)
                state.tag = f"rank{r}"
                state.commits += 1
                state.commit()  # rank 0's notification reaches every rank here
                raise AssertionError("commit after a host update did not raise HostsUpdatedInterrupt")
            state.commit()  # the notification was consumed: no second interrupt
            _train_step(model, opt, 1)  # an optimizer made before the reset still averages gradients
            params = [p.detach().clone() for p in model.parameters()]  # (BatchNorm buffers stay local)
            root = hvd.broadcast_object(params if r == 0 else None, root_rank=0)
            assert all(torch.equal(a, b) for a, b in zip(params, root)), "ranks diverged after the reset"
            return hvd.allreduce(torch.ones(1), op=hvd.Sum, name=f"after.reset.{int(kind)}").item()

        total = train(state, kind)
        assert total == P, total
        assert resets == [P], resets
        synced = kind != hvd.elastic.HostUpdateResult.removed
        assert calls == ["start", "rank0" if synced else f"rank{r}"], (kind, calls)
        out[kind.name] = calls
    # a HostsUpdatedInterrupt raised by the script on every rank: reset, sync, call again
    state = hvd.elastic.ObjectState(value=r)
    calls = []

    @hvd.elastic.run
    def again(state):
        calls.append(state.value)
        if len(calls) == 1:
            raise HostsUpdatedInterrupt(False)
        return state.value

    assert again(state) == 0 and calls == [0, 0], calls
    return {"hosts_updated": out}


def object_sync():
    P, r = hvd.size(), hvd.rank()
    obj = hvd.elastic.ObjectState(epoch=r, names={"rank": r}, blob=[r] * (r + 1))
    got = hvd.elastic.run(lambda o: (o.epoch, o.names, o.blob))(obj)
    assert got == (0, {"rank": 0}, [0]), got
    model = _model(100 + r)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train_step(model, opt, 0)  # momentum buffers that differ per rank
    mine = _snapshot(model, opt)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=r)
    epoch, snap = hvd.elastic.run(lambda s: (s.epoch, _snapshot(s.model, s.optimizer)))(state)
    assert epoch == 0, epoch
    root = hvd.broadcast_object(snap if r == 0 else None, root_rank=0)
    _same(snap, root, "TorchState after sync")
    assert r == 0 or _differs(mine, snap), "this rank's model was not replaced by rank 0's"
    return {}


def sampler():
    P, r = hvd.size(), hvd.rank()
    n, bs = 23, 2
    dataset = list(range(n))
    s = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=5)
    per = -(-n // P)
    assert len(s) == per and len(list(s)) == per, (len(s), list(s))
    everyone = hvd.allgather_object(list(s))
    assert sorted(set(i for part in everyone for i in part)) == dataset, everyone
    assert sum(len(p) for p in everyone) == per * P
    s2 = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=5)
    assert list(s2) == list(s), "same seed and epoch, different order"

    model = _model(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, sampler=s, batch=0)
    first_pass = list(s)
    processed = set()

    @hvd.elastic.run
    def train(state):
        for batch_idx in range(0, 3):
            mine = state.sampler.get_indices(batch_idx, bs)
            assert mine == first_pass[batch_idx * bs:(batch_idx + 1) * bs]
            state.sampler.record_batch(batch_idx, bs)
            state.batch += 1
            if batch_idx == 1:
                state.commit()
                processed.update(i for part in hvd.allgather_object(first_pass[:2 * bs]) for i in part)
        raise hvd.HorovodInternalError("after an uncommitted batch")

    try:
        train(state)
        raise AssertionError("no HorovodInternalError")
    except hvd.HorovodInternalError:
        pass
    assert state.batch == 2
    assert set(state.sampler.state_dict()["processed_indices"]) == processed, state.sampler.state_dict()
    rest = hvd.allgather_object(list(state.sampler))
    covered = set(i for part in rest for i in part)
    assert covered == set(dataset) - processed, (covered, processed)
    assert len(state.sampler) == -(-(n - len(processed)) // P)

    # record_indices: each rank records only its own indices; TorchState's sync merges them
    s3 = hvd.elastic.ElasticSampler(dataset, shuffle=False)
    own = s3.get_indices(0, bs)
    s3.record_indices(own)
    st3 = hvd.elastic.TorchState(sampler=s3)
    hvd.elastic.run(lambda st: None)(st3)
    merged = set(i for part in hvd.allgather_object(own) for i in part)
    assert set(s3.state_dict()["processed_indices"]) == merged, (s3.state_dict(), merged)
    assert not merged & set(i for part in hvd.allgather_object(list(s3)) for i in part)

    # set_epoch: a new order and nothing processed; Horovod 0.28's state_dict form loads
    order0 = list(state.sampler)
    state.sampler.set_epoch(1)
    assert state.sampler.state_dict()["processed_indices"] == [] and len(state.sampler) == per
    assert list(state.sampler) != order0
    s4 = hvd.elastic.ElasticSampler(dataset, seed=5)
    s4.load_state_dict({"epoch": 0, "processed_num": 2 * bs * P})
    assert set(s4.state_dict()["processed_indices"]) == processed
    return {}


def lost_rank():
    P, r = hvd.size(), hvd.rank()
    model = _model(2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, batch=0)
    committed = {}

    @hvd.elastic.run
    def train(state):
        for step in range(state.batch, 1000):
            if step == 5 and r == P - 1:
                os._exit(3)  # vanish: a lost rank
            _train_step(model, opt, step)
            state.batch = step + 1
            if state.batch == 3:
                state.commit()
                committed["snap"] = _snapshot(model, opt)
        return "finished"

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # report even while the launcher stops the job
    try:
        result = train(state)
        return {"error": None, "result": result}
    except hvd.HorovodInternalError as e:
        _same(_snapshot(model, opt), committed["snap"], "restored after the lost rank")
        return {"error": str(e), "origin_rank": e.origin_rank, "batch": state.batch}


CASES = {"restore": restore, "hosts_updated": hosts_updated, "object_sync": object_sync, "sampler": sampler,
         "lost_rank": lost_rank}


def main(names: str) -> None:
    torch.set_num_threads(1)
    hvd.init()
    data = {"ok": False, "rank": hvd.rank(), "size": hvd.size(), "cases": []}
    try:
        for name in names.split(","):
            data.update(CASES[name]() or {})
            data["cases"].append(name)
        data["ok"] = True
    finally:
        report(data)
        hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
