"""Worker for tests/runtime/test_carry.py: cached allreduces, whose data the tree negotiation
carries when small enough (APPLIANCE_CARRY_BYTES), on real ranks (numpy API).

Usage: carry.py results | carry.py steady N

results: every case (op x dtype x size x scales) runs three times under one name, so that the
later runs are cached; the rank reports each case's last output as hex bytes, and its stats.
steady: one warm-up step, then N synchronous 4 KiB float32 Sum allreduces under one name; the
rank reports the DATA frames it sent and the entries completed from carried results during them.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _report import report  # noqa: E402

import appliance.runtime as rt  # noqa: E402
from appliance.runtime import engine  # noqa: E402

# Below, at and above APPLIANCE_CARRY_BYTES=8192 (the test's setting) for 4-byte and 2-byte types.
SIZES = [1, 100, 2048, 2049, 4096, 4097]
CASES = [(op, dt, n, pre, post)
         for op, scales in ((rt.Sum, [(1.0, 1.0), (2.0, 0.5)]), (rt.Average, [(1.0, 1.0), (0.5, 4.0)]),
                            (rt.Min, [(1.0, 1.0)]), (rt.Max, [(1.0, 1.0)]), (rt.Product, [(1.0, 1.0)]))
         for dt in (np.float32, np.float16) for n in SIZES for pre, post in scales]


def data(rank, dtype, n, salt):
    # Small integers: every reduction order gives the same bits (float16's too).
    g = np.random.RandomState(7919 * rank + 31 * n + salt)
    return g.randint(-3, 4, n).astype(dtype)


def case_results():
    rt.init()
    out = {}
    for k, (op, dt, n, pre, post) in enumerate(CASES):
        name = f"c{k}"
        for rep in range(3):
            x = data(rt.rank(), dt, n, k)
            got = rt.allreduce(x, op=op, name=name, prescale_factor=pre, postscale_factor=post)
        out[name] = np.asarray(got).tobytes().hex()
    report({"out": out, "stats": dict(engine.current().core.stats())})
    rt.shutdown()


def case_steady(n):
    n = int(n)
    rt.init()
    e = engine.current()
    x = np.ones(1024, np.float32)  # 4 KiB
    for _ in range(3):
        rt.allreduce(x, op=rt.Sum, name="steady")
    before = dict(e.core.stats())
    for i in range(n):
        got = rt.allreduce(x * (i + 1), op=rt.Sum, name="steady")
        if not np.array_equal(got, np.full(1024, (i + 1) * rt.size(), np.float32)):
            raise AssertionError(f"step {i}: {got[:4]}")
    after = dict(e.core.stats())
    report({"data_frames": after["data_frames"] - before["data_frames"], "carried": after["carried"] - before["carried"],
            "tensors": after["tensors"] - before["tensors"]})
    rt.shutdown()


if __name__ == "__main__":
    globals()["case_" + sys.argv[1]](*sys.argv[2:])
