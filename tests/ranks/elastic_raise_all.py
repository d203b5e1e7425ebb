"""Rank program for "every rank fails" in an elastic job: a Horovod-style elastic program
(``hvd.elastic.run`` over an ``ObjectState``, here ``appliance.hvdcompat.elastic`` on the numpy API,
no torch, so that a rank's own exit takes milliseconds and a test's time bound measures the
launcher, not the interpreter's teardown of a large framework) whose every rank raises
``RuntimeError`` (outside ``HorovodInternalError``) in the training function at the same step.

Usage: elastic_raise_all.py OUT FAIL_AT [STEP_S]. Each step allreduces one vector and commits; at
step FAIL_AT every rank raises. Evidence in OUT (a directory every host sees, e.g. the appliance's
shared directory): ``step.W`` (JSON: rank, size, step, wall-clock ``t`` after every step;
rewritten; W = APPLIANCE_ELASTIC_WORKER, else HOROVOD_RANK) and ``done.W`` if a rank ever
finishes (it must not).
"""
import json
import os
import pickle
import sys
import time

import numpy as np

import appliance.runtime as rt
from appliance.hvdcompat.elastic import ObjectState, run_fn

OUT = sys.argv[1]
FAIL_AT = int(sys.argv[2])
STEP_S = float(sys.argv[3]) if len(sys.argv) > 3 else 0.1
WID = os.environ.get("APPLIANCE_ELASTIC_WORKER", os.environ.get("HOROVOD_RANK", "0"))


def write(name: str, data: dict) -> None:
    tmp = os.path.join(OUT, f".{name}.{WID}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(OUT, f"{name}.{WID}"))


def bcast_object(obj):
    data = np.frombuffer(pickle.dumps(obj), np.uint8) if rt.rank() == 0 else np.zeros(0, np.uint8)
    n = rt.broadcast(np.array([data.size], np.int64), 0, name="obj.size")
    buf = data if rt.rank() == 0 else np.zeros(int(n[0]), np.uint8)
    return pickle.loads(rt.broadcast(buf, 0, name="obj.data").tobytes())


def reset():
    rt.shutdown()
    rt.init()


def train(state):
    while True:
        step = state.step + 1
        if step == FAIL_AT:
            raise RuntimeError(f"rank {rt.rank()}: failing at step {step} as asked")
        rt.allreduce(np.ones(4), op=rt.Sum, name="grad")
        state.step = step
        write("step", {"rank": rt.rank(), "size": rt.size(), "step": step, "t": time.time()})
        state.commit()
        time.sleep(STEP_S)


rt.init()
state = ObjectState(bcast_object, rt.rank, step=0)
run_fn(train, reset)(state)
write("done", {"rank": rt.rank(), "step": state.step})
rt.shutdown()
