"""Rank program for the tests of a job's numbers (tests/launcher/test_observe_jobs.py): an elastic
loop on the numpy API (no torch: a rank starts in well under a second) whose state is an
``ObjectState`` with ``step``; one allreduce, a sleep of STEP_S and a commit per step, each commit
counted as a step for the metrics (``note_step("commit")``, as ``horovod.torch``'s state does).

Usage: observe_elastic.py STEPS STEP_S. Prints ``step S size N rank R`` after every step and
``done rank R size N step S`` at the end. Runs under ``appliance launch`` and under an elastic
``horovodrun`` alike (``hvd.elastic.run``'s loop, ``appliance.hvdcompat.elastic.run_fn``).
"""
import pickle
import sys
import time

import numpy as np

import appliance.runtime as rt
from appliance.hvdcompat.elastic import ObjectState, run_fn
from appliance.runtime import metrics

STEPS, STEP_S = int(sys.argv[1]), float(sys.argv[2])


def bcast_object(obj):
    data = np.frombuffer(pickle.dumps(obj), np.uint8) if rt.rank() == 0 else np.zeros(0, np.uint8)
    n = rt.broadcast(np.array([data.size], np.int64), 0, name="obj.size")
    buf = data if rt.rank() == 0 else np.zeros(int(n[0]), np.uint8)
    return pickle.loads(rt.broadcast(buf, 0, name="obj.data").tobytes())


class State(ObjectState):
    def commit(self):
        metrics.note_step("commit")
        super().commit()


def reset():
    rt.shutdown()
    rt.init()


def train(state):
    while state.step < STEPS:
        rt.allreduce(np.ones(4), op=rt.Sum, name="x")
        print(f"step {state.step} size {rt.size()} rank {rt.rank()}", flush=True)
        state.step += 1
        time.sleep(STEP_S)
        state.commit()


rt.init()
state = State(bcast_object, rt.rank, step=0)
run_fn(train, reset)(state)
print(f"done rank {rt.rank()} size {rt.size()} step {state.step}", flush=True)
rt.shutdown()
