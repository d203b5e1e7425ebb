"""Rank bodies for tests/runtime/test_runtime_faults.py and test_numpy_lifetime.py (numpy API).

Usage: fault_worker.py CASE [ARGS...], started by rank_group.RankGroup with the contract
environment. Each rank writes rank<R>.json into APPLIANCE_TEST_OUT (atomically) and marker
files the test waits for (ready<R>). Exit codes: 0 ok, 3 the job failed as the case expects,
1 anything else.
"""
import gc
import json
import os
import sys
import time

import numpy as np

import appliance.runtime as rt
from appliance.runtime import engine

OUT = os.environ["APPLIANCE_TEST_OUT"]
RANK = int(os.environ["HOROVOD_RANK"])


def report(data: dict) -> None:
    tmp = os.path.join(OUT, f".rank{RANK}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(OUT, f"rank{RANK}.json"))


def touch(name: str) -> None:
    with open(os.path.join(OUT, name), "w") as f:
        f.write(repr(time.time()))


def failed(e: rt.HorovodInternalError, started: float) -> None:
    report({"error": str(e), "origin_rank": e.origin_rank, "origin_host": e.origin_host, "code": e.code,
            "at": time.time(), "started": started})
    os._exit(3)


def case_stall(skipper):
    """Rank `skipper` skips allreduce 'grad.skipped' and goes on to the next one: a deadlock."""
    skipper = int(skipper)
    rt.init()
    rt.barrier()
    started = time.time()
    x = np.ones(16, np.float32)
    try:
        if RANK == skipper:
            time.sleep(0.3)  # the skipped tensor is the older one
            rt.allreduce(x, name="next.step")
        else:
            rt.allreduce(x, name="grad.skipped")
    except rt.HorovodInternalError as e:
        failed(e, started)
    report({"error": None})


def case_steps():
    """Small allreduces in a loop until the job fails (a test kills or stops a rank)."""
    rt.init()
    rt.barrier()
    touch(f"ready{RANK}")
    started = time.time()
    x = np.ones(16, np.float32)
    try:
        i = 0
        while time.time() - started < 60:
            rt.allreduce(x, op=rt.Sum, name=f"step{i}")
            i += 1
            time.sleep(0.01)
    except rt.HorovodInternalError as e:
        failed(e, started)
    report({"error": None})


def case_hold():
    """Join, say ready, wait for the test's 'go', then prove the job still works."""
    rt.init()
    rt.barrier()
    touch(f"ready{RANK}")
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(OUT, "go")):
        if time.time() > deadline:
            sys.exit(1)
        time.sleep(0.02)
    got = rt.allreduce(np.ones(4, np.float32), op=rt.Sum, name="after")
    ok = bool(np.all(got == rt.size()))
    rt.shutdown()
    report({"ok": ok})
    sys.exit(0 if ok else 1)


def case_dropped(rounds):
    """Async ops whose handles rank 0 drops at once, while rank 1 holds its side back so the ops
    are still pending; rank 0 then fills memory with a pattern. Rank 1 checks the results (they
    depend on rank 0's inputs), rank 0 that its pattern survived (nobody wrote into it)."""
    rounds = int(rounds)
    rt.init()
    sizes = [8192, 1 << 20, 3000]  # heap-sized and mmap-sized arrays (float64)
    bad = []
    for rnd in range(rounds):
        names = [f"d{rnd}.{i}" for i in range(len(sizes) * 4)]
        inputs = [np.arange(2 * sizes[i % len(sizes)], dtype=np.float64)[::2] * (i + 1) for i in range(len(names))]
        if RANK == 0:
            for name, base in zip(names, inputs):
                rt.allreduce_async(base + RANK, op=rt.Sum, name=name)  # a temporary input, a dropped handle
            del base
            gc.collect()
            junk = [np.full(s, -7.0) for s in sizes for _ in range(8)]
            rt.barrier()  # every dropped op has completed before this one
            if any(not np.all(j == -7.0) for j in junk):
                bad.append(f"round {rnd}: memory given back to the allocator was written into")
            del junk
        else:
            time.sleep(0.1)
            hs = [rt.allreduce_async(base + RANK, op=rt.Sum, name=name) for name, base in zip(names, inputs)]
            for name, h, base in zip(names, hs, inputs):
                got = rt.synchronize(h)
                if not np.array_equal(got, 2 * base + 1):
                    bad.append(f"round {rnd}: {name} wrong (rank 0's input was freed while in use)")
            rt.barrier()
    rt.allreduce(np.ones(1), name="last")
    report({"bad": bad[:5], "kept": engine.current().kept()})
    rt.shutdown()


if __name__ == "__main__":
    case, args = sys.argv[1], sys.argv[2:]
    globals()[f"case_{case}"](*args)
