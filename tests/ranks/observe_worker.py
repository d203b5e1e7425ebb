"""Rank program for the launcher's view tests (tests/launcher/*observe*): steps that take time, with output.

Usage: observe_worker.py STEPS STEP_MS [SLOW_RANK SLOW_MS [PRINT_EVERY]]. Every step each rank
sleeps STEP_MS (compute), SLOW_RANK (-1: none) sleeps SLOW_MS more, then one allreduce; one
explicit step of 8 samples is counted (``appliance.runtime.metrics``), the job's total announced
first (the view's ETA). Every PRINT_EVERY steps (default 10) each rank prints
``rank R step S line N`` on stdout (N counts its lines from 1), so a test can check that the job's
output scrolls above the view whole and in order.
"""
import sys
import time

import numpy as np

import appliance.runtime as rt
from appliance.runtime import metrics


def main() -> None:
    steps, step_ms = int(sys.argv[1]), float(sys.argv[2])
    slow_rank = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    slow_ms = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    every = int(sys.argv[5]) if len(sys.argv) > 5 else 10
    metrics.set_progress(total=steps, samples_per_step=8)
    rt.init()
    r = rt.rank()
    grad = np.ones(1024, np.float32)
    n = 0
    for i in range(1, steps + 1):
        time.sleep((step_ms + (slow_ms if r == slow_rank else 0.0)) / 1000)
        rt.allreduce(grad, name="grad")
        metrics.note_step("explicit")
        if i % every == 0:
            n += 1
            print(f"rank {r} step {i} line {n}", flush=True)
    rt.shutdown()


if __name__ == "__main__":
    main()
