"""Worker: process sets and join rules on real ranks (appliance.torch), written from Horovod's
documented behaviour. Usage: process_sets.py CASES (comma-separated: static, dynamic, ops, optimizer,
errors, join). Each case records what it saw; the test compares with the expected values.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _report import report  # noqa: E402

import appliance.torch as hvd  # noqa: E402


def caught(fn):
    """The exception class name and message fn raised (None when it returned)."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return [type(e).__name__, str(e)]
    return None


def case_static(r, n, out):
    # hvd.init(process_sets=[...]) registered the sets given on the command line (see main)
    evens, odds, repeat = SETS
    out["static"] = {"ids": [evens.process_set_id, odds.process_set_id, repeat.process_set_id],
                     "global": [hvd.global_process_set.process_set_id, hvd.global_process_set.size()],
                     "sizes": [evens.size(), odds.size()], "ranks_in": [evens.rank(), odds.rank()],
                     "included": [evens.included(), odds.included()]}
    mine = evens if r % 2 == 0 else odds
    out["static"]["sum"] = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=mine).item()


def case_dynamic(r, n, out):
    # every rank duplicates the global set: refused, as in Horovod (at 2 ranks [0, n - 1] is every rank)
    global_dup = [caught(lambda: hvd.add_process_set(list(range(n)))),
                  caught(lambda: hvd.add_process_set([n - 1, 0])) if n == 2 else None]
    first = hvd.add_process_set([0, n - 1] if n > 2 else [0])
    second = hvd.add_process_set(hvd.ProcessSet(list(range(n))[1:]))
    ids = [first.process_set_id, second.process_set_id]
    dup = caught(lambda: hvd.add_process_set(list(reversed(first.ranks))))
    removed = hvd.remove_process_set(first)
    again = hvd.remove_process_set(first)
    use_removed = caught(lambda: hvd.allreduce(torch.ones(1), process_set=first)) if r in (0, n - 1) else None
    third = hvd.add_process_set([0])  # takes the smallest free id: first's
    empty = hvd.add_process_set([])   # allowed (the odd ranks of a one-rank job): nobody runs on it
    empty_id = empty.process_set_id
    hvd.remove_process_set(empty)
    out["dynamic"] = {"ids": ids, "dup": dup, "global_dup": global_dup, "removed": [removed, again], "use_removed": use_removed,
                      "reused_id": third.process_set_id, "empty_id": empty_id, "global_removed": hvd.remove_process_set(hvd.global_process_set)}
    hvd.remove_process_set(second)
    hvd.remove_process_set(third)


def case_ops(r, n, out):
    """Every collective on the even ranks and on the odd ranks at the same time, with the same
    (automatic and explicit) names in both sets."""
    evens = hvd.add_process_set(list(range(0, n, 2)))
    odds = hvd.add_process_set(list(range(1, n, 2))) if n > 1 else None
    mine = evens if r % 2 == 0 else odds
    members = mine.ranks
    k, me = len(members), members.index(r)
    got = {}
    got["allreduce"] = hvd.allreduce(torch.full((5,), float(r)), op=hvd.Sum, process_set=mine).tolist()
    got["average"] = hvd.allreduce(torch.full((3,), float(r)), name="same.name", process_set=mine).tolist()
    got["grouped"] = [t.tolist() for t in hvd.grouped_allreduce([torch.ones(2) * r, torch.ones(3)], op=hvd.Sum,
                                                                 process_set=mine)]
    got["allgather"] = hvd.allgather(torch.full((r + 1, 2), float(r)), process_set=mine)[:, 0].tolist()
    root = members[-1]
    got["broadcast"] = hvd.broadcast(torch.full((4,), float(r)), root, process_set=mine).tolist()
    got["alltoall"] = hvd.alltoall(torch.arange(k, dtype=torch.float32) + 10 * r, process_set=mine).tolist()
    got["reducescatter"] = hvd.reducescatter(torch.ones(2 * k, dtype=torch.float32) * (r + 1), op=hvd.Sum,
                                             process_set=mine).tolist()
    got["bcast_object"] = hvd.broadcast_object({"from": r}, root_rank=root, process_set=mine)
    got["allgather_object"] = hvd.allgather_object(r, process_set=mine)
    # gradients flow within the set: d(sum allreduce)/dx = set size
    x = torch.ones(3, requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum, process_set=mine).sum().backward()
    got["grad"] = x.grad.tolist()
    hvd.barrier(process_set=mine)
    got["set_rank"] = [mine.rank(), mine.size(), me, k]
    # the global set still works in between
    got["global"] = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
    out["ops"] = got
    if odds is not None:
        hvd.remove_process_set(odds)
    hvd.remove_process_set(evens)


def case_optimizer(r, n, out):
    """DistributedOptimizer(process_set=evens) built on every rank: the even ranks average their
    gradients, the odd ranks train alone."""
    evens = hvd.add_process_set(list(range(0, n, 2)))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=evens)
    x = torch.full((2, 4), float((r + 1) ** 2))  # the evens' average differs from every odd rank's own
    model(x).sum().backward()
    opt.step()
    w = model.weight.detach().clone()
    allw = hvd.allgather(w)  # every rank's weights, in rank order
    out["optimizer"] = {"weights": allw[:, 0].tolist()}
    hvd.remove_process_set(evens)


def case_errors(r, n, out):
    """Bad input fails the operation concerned, with the set named, and the runtime stays usable."""
    evens = hvd.add_process_set(list(range(0, n, 2)))
    errs = {}
    if r % 2 == 1:
        errs["not_member"] = caught(lambda: hvd.allreduce(torch.ones(1), process_set=evens))
    else:
        errs["bad_root"] = caught(lambda: hvd.broadcast(torch.ones(1), 1, process_set=evens))
        # a shape mismatch inside the set: only the set's ranks see it, and recover
        shape = (2,) if r == 0 else (3,)
        errs["mismatch"] = caught(lambda: hvd.allreduce(torch.ones(shape), name="bad", process_set=evens))
        errs["after"] = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=evens).item()
    errs["unregistered"] = caught(lambda: hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0])))
    errs["disagree"] = caught(lambda: hvd.add_process_set([0] if r == 0 else [0, 1]))
    errs["global_after"] = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
    out["errors"] = errs
    hvd.remove_process_set(evens)


def case_join(r, n, out):
    """Horovod's join rules: allreduce with joined ranks contributes zeros; allgather, broadcast,
    alltoall and reducescatter raise on the calling ranks only; join returns the last rank to join;
    the runtime stays usable after each."""
    res = {"allreduce": [], "raised": {}, "last": []}
    for first in range(n):
        if r == first:
            res["last"].append(hvd.join())
        else:
            res["allreduce"].append(hvd.allreduce(torch.full((3,), float(r + 1)), op=hvd.Sum,
                                                  name=f"j.{first}").tolist())
            time.sleep(0.05 * r)  # the highest other rank joins last
            res["last"].append(hvd.join())
    calls = {
        "allgather": lambda: hvd.allgather(torch.ones(2, 2)),
        "broadcast": lambda: hvd.broadcast(torch.ones(2), 1 % n, name="jb"),
        "alltoall": lambda: hvd.alltoall(torch.ones(n)),
        "reducescatter": lambda: hvd.reducescatter(torch.ones(n)),
    }
    for kind, call in calls.items():
        if r == 0:
            res["raised"][kind] = ["joined", hvd.join()]  # the joined rank is not told of the conflict
        else:
            res["raised"][kind] = caught(call)
            hvd.join()
    res["after"] = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
    out["join"] = res


SETS = ()


def main():
    global SETS
    cases = sys.argv[1].split(",")
    if "static" in cases:
        n = int(os.environ["HOROVOD_SIZE"])
        SETS = (hvd.ProcessSet(list(range(0, n, 2))), hvd.ProcessSet(list(range(1, n, 2))),
                hvd.ProcessSet(list(range(0, n, 2))))
        hvd.init(process_sets=[hvd.global_process_set, *SETS])  # the global set may be listed too
    else:
        hvd.init(process_sets="dynamic")
    r, n = hvd.rank(), hvd.size()
    out = {"rank": r, "size": n}
    for c in cases:
        globals()[f"case_{c}"](r, n, out)
    hvd.barrier()
    report(out)
    hvd.shutdown()


if __name__ == "__main__":
    main()
