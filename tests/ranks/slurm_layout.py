"""Worker of the Slurm tier: join the job, allreduce, report the layout (``slurm_layout.py MODE OUT``).

Modes: ``once`` (one allreduce, then exit 0), ``train`` (allreduce in a loop until the job fails
or it is stopped; ``ready.N`` marks the first collective done), ``fail`` (as ``train``, but rank
$LAYOUT_FAIL_RANK exits with code 3 after the first collective). Every rank writes
``OUT/rank{N}.json``: its layout as the runtime and the environment give it, the node it runs on,
the sum of all ranks (a real collective), ``t_first`` (wall time after the first collective) and
its pid; on the runtime's error it writes ``OUT/error.N`` with the message and exits 1.
It prints one stdout line ``layout RANK NODE`` so tests can check rank-prefixed output.
"""
import json
import os
import socket
import sys
import time

import numpy as np

import appliance.runtime as rt

mode, out = sys.argv[1], sys.argv[2]
t0 = time.time()


def write(name, data):
    tmp = os.path.join(out, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(data)
    os.replace(tmp, os.path.join(out, name))


rt.init()
r = rt.rank()
try:
    total = rt.allreduce(np.array([r + 1.0]), op=rt.Sum, name="layout")
    report = {
        "rank": r, "size": rt.size(), "local_rank": rt.local_rank(), "local_size": rt.local_size(),
        "cross_rank": rt.cross_rank(), "cross_size": rt.cross_size(), "node": socket.gethostname(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("HOROVOD_", "APPLIANCE_", "SLURM_"))
                or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")},
        "sum": float(total[0]), "t_start": t0, "t_first": time.time(), "pid": os.getpid(),
    }
    report["env"].pop("APPLIANCE_JOB_SECRET", None)
    report["secret_len"] = len(os.environ.get("APPLIANCE_JOB_SECRET", ""))
    write(f"rank{r}.json", json.dumps(report))
    print(f"layout {r} {socket.gethostname()}", flush=True)
    if mode == "fail" and r == int(os.environ["LAYOUT_FAIL_RANK"]):
        os._exit(3)  # at once, as a crash would: no orderly shutdown of the runtime
    if mode in ("train", "fail"):
        write(f"ready.{r}", "")
        step = 0
        while True:
            rt.allreduce(np.ones(1024), op=rt.Sum, name=f"step{step % 4}")
            step += 1
            time.sleep(0.01)
except rt.HorovodInternalError as e:
    write(f"error.{r}", str(e))
    print(f"rank {r}: {e}", file=sys.stderr, flush=True)
    sys.exit(1)
rt.shutdown()
