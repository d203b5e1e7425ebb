"""Rank bodies for tests/runtime/test_deadlock.py: ranks that wait on collectives that can never
match, and ranks that are only slow.

Usage: deadlock_worker.py CASE, started by rank_group.RankGroup with the contract environment
(HOROVOD_RANK/SIZE...). Each rank writes rank<R>.json into APPLIANCE_TEST_OUT: ``blocked_at``
(time.time() as it entered its last blocking call), then ``error``, ``code``, ``at`` (when the
call raised) or ``error: None`` with ``steps``. Exit codes: 0 the case finished, 3 the job
failed (HorovodInternalError), 4 a MismatchError, 1 anything else. The slow cases' rank is slow
for APPLIANCE_TEST_SLOW_S seconds (default 15; the test sets it a little beyond its deadlock bound).
"""
import json
import os
import sys
import time

import numpy as np

import appliance.runtime as rt
from appliance.runtime import engine
from appliance.runtime import process_sets

OUT = os.environ["APPLIANCE_TEST_OUT"]
RANK = int(os.environ["HOROVOD_RANK"])
SIZE = int(os.environ["HOROVOD_SIZE"])
SLOW_S = float(os.environ.get("APPLIANCE_TEST_SLOW_S", "15"))
state = {"steps": 0, "blocked_at": None}


def report(data: dict) -> None:
    tmp = os.path.join(OUT, f".rank{RANK}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(dict(state, **data), f)
    os.replace(tmp, os.path.join(OUT, f"rank{RANK}.json"))


def blocking(fn, *args, **kwargs):
    state["blocked_at"] = time.time()
    return fn(*args, **kwargs)


def x():
    return np.ones(16, np.float32)


def case_names():
    """Rank 0 in an allreduce, the others in a broadcast of another name."""
    if RANK == 0:
        blocking(rt.allreduce, x(), name="grads")
    else:
        blocking(rt.broadcast, x(), 0, name="state")


def case_same_name():
    """Rank 0 allreduces 'x', the others broadcast 'x': a mismatch, named at once."""
    if RANK == 0:
        blocking(rt.allreduce, x(), name="x")
    else:
        blocking(rt.broadcast, x(), 0, name="x")


def case_order():
    """Rank 0: 'a' then 'b'; the others: 'b' then 'a', each synchronously."""
    for name in ("a", "b") if RANK == 0 else ("b", "a"):
        blocking(rt.allreduce, x(), name=name)


def case_join():
    """Rank 0 joins; rank 1 allreduces 'a', the others 'b'."""
    if RANK == 0:
        blocking(rt.join)
    else:
        blocking(rt.allreduce, x(), name="a" if RANK == 1 else "b")


def case_sets():
    """Process set {0, 1} mismatched ('a' vs 'b'); set {2, 3} allreduces on until the job fails."""
    first, second = process_sets.ProcessSet([0, 1]), process_sets.ProcessSet([2, 3])
    process_sets.setup([first, second])
    e = engine.current()
    if RANK < 2:
        req = engine.request(engine.Kind.ALLREDUCE, rt.Sum, process_set=first.process_set_id)
        a = x()
        blocking(lambda: e.wait(e.submit(req, "a" if RANK == 0 else "b", engine.describe(a, a))))
        return
    req = engine.request(engine.Kind.ALLREDUCE, rt.Sum, process_set=second.process_set_id)
    while True:
        a = x()
        blocking(lambda: e.wait(e.submit(req, "step", engine.describe(a, a))))
        state["steps"] += 1
        time.sleep(0.05)


def case_checkpoint():
    """Rank 1 'checkpoints' for SLOW_S before its allreduce; the others wait in theirs."""
    rt.allreduce(x(), name="before")
    if RANK == 1:
        time.sleep(SLOW_S)
    blocking(rt.allreduce, x(), name="after")
    state["steps"] = 2


def case_long_step():
    """A SLOW_S step on rank 0; the others submitted three gradients asynchronously (as the torch
    hooks do) and wait on them in turn; rank 0 then submits them in another order."""
    names = ["g0", "g1", "g2"]
    if RANK == 0:
        time.sleep(SLOW_S)
        names.reverse()
    arrays = [x() for _ in names]
    state["blocked_at"] = time.time()
    handles = [rt.allreduce_async(a, name=n) for a, n in zip(arrays, names)]
    for h in handles:
        rt.synchronize(h)
    state["steps"] = 1


def main():
    case = sys.argv[1]
    rt.init()
    rt.barrier()
    try:
        globals()["case_" + case]()
    except rt.HorovodInternalError as e:
        report({"error": str(e), "code": e.code, "origin_rank": e.origin_rank, "at": time.time()})
        os._exit(3)
    except rt.MismatchError as e:
        report({"error": str(e), "code": "mismatch", "at": time.time()})
        os._exit(4)
    report({"error": None})
    rt.shutdown()


if __name__ == "__main__":
    main()
