"""A rank of the process-manager bootstrap tests (tests/runtime/test_procmgr_faults.py), started by
``mpirun`` or ``mpiexec.hydra``: ``appliance.runtime.init()``, one allreduce of ``rank + 1``, then
``OK rank R size S val V`` and shutdown. No torch: the bootstrap is the runtime's, for every framework.

Faults come in the environment, applied only on the rank ``PM_ONLY`` names (its rank as the process
manager first set it; every rank when unset), before anything of the appliance is imported:

- ``PM_SET``: ``NAME=VALUE`` pairs joined by ``;`` put into this process's environment (a wrapper's
  ``export``); ``PM_UNSET``: names joined by ``,`` removed (a trailing ``*`` removes every name
  with that prefix);
- ``PM_FAULT``: ``kill`` (SIGKILL itself ``PM_DELAY`` s after entering init; before init when
  ``PM_DELAY`` is negative), ``stop`` (SIGSTOP itself before init), ``never`` (never calls init:
  sleeps ``PM_SLEEP`` s, 60 by default, and exits 0); ``PM_LATE`` s of sleep before init.

``PM_MODE`` (every rank) varies what follows init, as a script's mistakes do: ``init_twice``,
``reinit`` (init, shutdown, init), and the cross-rank mismatches, where rank 1 differs from rank 0:
``mismatch_op`` (broadcast against allreduce, one name), ``mismatch_name`` (``t1`` against ``t0``),
``mismatch_shape`` ([3] against [2]), ``mismatch_kind`` (allreduce ``a`` against allgather ``g``),
``extra`` (rank 0 runs one more allreduce after the others have shut down).
"""
import os
import signal
import sys
import threading
import time

first = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK") or "0"
if os.environ.get("PM_ONLY", first) == first:
    for pair in filter(None, os.environ.get("PM_SET", "").split(";")):
        name, _, value = pair.partition("=")
        os.environ[name] = value
    for name in filter(None, os.environ.get("PM_UNSET", "").split(",")):
        for k in [k for k in os.environ if k == name or (name.endswith("*") and k.startswith(name[:-1]))]:
            del os.environ[k]
    fault = os.environ.get("PM_FAULT", "")
else:
    fault = ""

time.sleep(float(os.environ.get("PM_LATE", "0")) if fault else 0)
delay = float(os.environ.get("PM_DELAY", "-1"))
if fault == "kill" and delay < 0 or fault == "stop":
    os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
if fault == "never":
    sys.stdout.write(f"never init, rank {first} sleeping\n")
    sys.stdout.flush()
    time.sleep(float(os.environ.get("PM_SLEEP", "60")))
    sys.exit(0)

import numpy as np  # noqa: E402

import appliance.runtime as rt  # noqa: E402

if fault == "kill":
    threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
mode = os.environ.get("PM_MODE", "")
rt.init()
if mode == "init_twice":
    rt.init()
if mode == "reinit":
    rt.shutdown()
    rt.init()
val = rt.allreduce(np.array([rt.rank() + 1.0]), op=rt.Sum, name="x")[0]
sys.stdout.write(f"OK rank {rt.rank()} size {rt.size()} local {rt.local_rank()}/{rt.local_size()} val {val:g}\n")
sys.stdout.flush()
odd = rt.rank() == 1
if mode == "mismatch_op":
    (rt.broadcast(np.ones(2), 0, name="t") if odd else rt.allreduce(np.ones(2), name="t"))
elif mode == "mismatch_name":
    rt.allreduce(np.ones(2), name="t1" if odd else "t0")
elif mode == "mismatch_shape":
    rt.allreduce(np.ones(3 if odd else 2), name="t")
elif mode == "mismatch_kind":
    (rt.allgather(np.ones(2), name="g") if odd else rt.allreduce(np.ones(2), name="a"))
elif mode == "extra" and rt.rank() == 0:
    time.sleep(0.5)
    rt.allreduce(np.ones(2), name="b")
rt.shutdown()
