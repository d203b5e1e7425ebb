"""Rank program for tests/runtime/test_metrics.py: collectives in a loop, with the metrics on.

Usage: metrics_worker.py STEPS [SLOW_RANK SLOW_MS [STEP_MS]]. Every step: SLOW_RANK (-1: none)
sleeps SLOW_MS before the step's allreduce, every rank sleeps STEP_MS (a stand-in for compute),
then an allreduce, an allgather and a broadcast; one explicit step of 8 samples is counted. After
the loop each rank reports its core counters (Runtime.metrics()) and, with the test's file
"linger" present, waits for "release" (so a sample carries the final counters) before shutdown.
"""
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _report import report  # noqa: E402

import appliance.runtime as rt  # noqa: E402
from appliance.runtime import engine, metrics  # noqa: E402


def main() -> None:
    steps = int(sys.argv[1])
    slow_rank = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    slow_ms = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    step_ms = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    rt.init()
    r = rt.rank()
    grad = np.ones(4096, np.float32)
    for i in range(steps):
        if step_ms:
            time.sleep(step_ms / 1000)
        if r == slow_rank:
            time.sleep(slow_ms / 1000)
        rt.allreduce(grad, name="grad")
        rt.allgather(np.full(3, r, np.int32), name="gather")
        rt.broadcast(np.zeros(16, np.float64), 0, name="bcast")
        metrics.note_step("explicit", 8)
    out = os.environ["APPLIANCE_TEST_OUT"]
    report({"rank": r, "metrics": engine.current().core.metrics(), "pid": os.getpid(),
            "threads": [t.name for t in threading.enumerate()]})
    if os.path.exists(os.path.join(out, "linger")):
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(out, "release")) and time.monotonic() < deadline:
            time.sleep(0.02)
    rt.shutdown()


if __name__ == "__main__":
    main()
