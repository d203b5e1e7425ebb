"""Rank program for the elastic launcher tests: a tiny deterministic "training" on the numpy API
under ``hvd.elastic.run``'s loop (``appliance.hvdcompat.elastic.run_fn``), no torch, so a worker
starts in well under a second.

State (an ``ObjectState``): ``step``, ``w`` and ``sizes`` (the job size at every step). Each step
allreduces (Sum) a vector of ones, so ``w`` grows by the size of the job at that step: the final
``w`` tells exactly which sizes the committed steps ran at. A commit every ``COMMIT`` steps.

Usage: elastic_steps.py OUT STEPS [COMMIT] [STEP_S]. Behaviour switches, as files in OUT (so a
test can aim them at one worker while the job runs):
- ``fail.W`` (content: a step number): worker W raises RuntimeError at that step (exits 1);
- ``kill.W``: worker W SIGKILLs itself at that step;
- ``hang.W``: worker W stops stepping there (sleeps) without failing;
- ``stop`` (for every worker): the job finishes after that step instead of STEPS;
- ``crash_from`` (content: a worker number): every worker numbered that or higher exits 1 at
  start, before it joins a round (a new worker that cannot start).
Evidence, per worker number W (APPLIANCE_ELASTIC_WORKER): ``pid.W`` (its pid), ``born.W`` (when
its process started until its imports were done: its own start), ``notice.W`` (JSON list: the
time of every host-change notice the worker's state received), ``up.W`` (its
rank and size after each round), ``step.W`` (rank, size, step after every step; rewritten) and,
at the end, ``done.W`` (JSON: worker, rank, size, step, w, sizes, resets, syncs, restores).
"""
import json
import os
import pickle
import signal
import sys
import time

import numpy as np

import appliance.runtime as rt
from appliance.hvdcompat.elastic import ObjectState, run_fn

OUT = sys.argv[1]
STEPS = int(sys.argv[2])
COMMIT = int(sys.argv[3]) if len(sys.argv) > 3 else 1
STEP_S = float(sys.argv[4]) if len(sys.argv) > 4 else 0.05
WID = int(os.environ.get("APPLIANCE_ELASTIC_WORKER", os.environ.get("HOROVOD_RANK", "0")))


def own_start() -> float:
    """Seconds from this process's start (the kernel's start time) to now."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")


OWN_START = own_start()


def write(name: str, data: str) -> None:
    tmp = os.path.join(OUT, f".{name}.{WID}.tmp")
    with open(tmp, "w") as f:
        f.write(data)
    os.replace(tmp, os.path.join(OUT, f"{name}.{WID}"))


def switch_at(name: str):
    """The step number in ``OUT/name`` (the same file for every worker), or None."""
    try:
        with open(os.path.join(OUT, name)) as f:
            return int(f.read().strip() or "0")
    except (OSError, ValueError):
        return None


def switch(name: str):
    path = os.path.join(OUT, f"{name}.{WID}")
    try:
        with open(path) as f:
            return int(f.read().strip() or "0")
    except (OSError, ValueError):
        return None


def bcast_object(obj):
    data = np.frombuffer(pickle.dumps(obj), np.uint8) if rt.rank() == 0 else np.zeros(0, np.uint8)
    n = rt.broadcast(np.array([data.size], np.int64), 0, name="obj.size")
    buf = data if rt.rank() == 0 else np.zeros(int(n[0]), np.uint8)
    return pickle.loads(rt.broadcast(buf, 0, name="obj.data").tobytes())


write("pid", str(os.getpid()))
write("born", json.dumps({"own_start": OWN_START}))
if switch_at("crash_from") is not None and WID >= switch_at("crash_from"):
    sys.exit(f"worker {WID}: failing at start as asked")
rt.init()
notices = []
counters = {"resets": 0, "syncs": 0, "restores": 0}


class State(ObjectState):
    def on_hosts_updated(self, timestamp, update_res):
        notices.append(time.time())
        write("notice", json.dumps(notices))
        super().on_hosts_updated(timestamp, update_res)

    def sync(self):
        counters["syncs"] += 1
        super().sync()

    def restore(self):
        counters["restores"] += 1
        super().restore()


state = State(bcast_object, rt.rank, step=0, w=np.zeros(4), sizes=[])


def reset():
    rt.shutdown()
    rt.init()
    counters["resets"] += 1


def train(state):
    write("up", json.dumps({"rank": rt.rank(), "size": rt.size(), "step": state.step}))
    while state.step < min(STEPS, switch_at("stop") or STEPS):
        step = state.step + 1
        if switch("fail") == step:
            raise SystemExit(f"worker {WID}: failing at step {step} as asked")
        if switch("kill") == step:
            os.kill(os.getpid(), signal.SIGKILL)
        while switch("hang") == step:
            time.sleep(0.1)
        g = rt.allreduce(np.ones(4), op=rt.Sum, name="grad")
        state.w = state.w + g
        state.sizes = state.sizes + [rt.size()]
        state.step = step
        write("step", json.dumps({"rank": rt.rank(), "size": rt.size(), "step": step, "t": time.time()}))
        if step % COMMIT == 0:
            state.commit()
        time.sleep(STEP_S)


run_fn(train, reset)(state)
write("done", json.dumps({"worker": WID, "rank": rt.rank(), "size": rt.size(), "step": state.step,
                          "w": state.w.tolist(), "sizes": state.sizes, **counters}))
rt.shutdown()
