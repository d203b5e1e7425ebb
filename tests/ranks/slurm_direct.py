"""A task of a direct ``srun python slurm_direct.py OUTDIR`` job: ``hvd.init()`` with no launcher,
one allreduce, then a JSON report ``OUTDIR/rank.<rank>.json`` (layout as the runtime reports it,
Slurm's own view, the allreduce's result, wall-clock times) for the tests to check."""
import json
import os
import socket
import sys
import time

import numpy as np

import appliance.runtime as hvd

out_dir = sys.argv[1]
t_start = time.time()
hvd.init()
t_init = time.time()
total = hvd.allreduce(np.full(7, hvd.rank() + 1, dtype=np.float64), op=hvd.Sum)
t_first = time.time()
report = {
    "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
    "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "hostname": socket.gethostname(),
    "slurm": {k: os.environ.get(k) for k in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURMD_NODENAME",
                                             "SLURM_JOB_ID", "SLURM_STEP_ID")},
    "sum": total.tolist(), "t_start": t_start, "t_init": t_init, "t_first_allreduce": t_first,
}
hvd.shutdown()
tmp = os.path.join(out_dir, f".rank.{report['rank']}.tmp")
with open(tmp, "w") as f:
    json.dump(report, f)
os.rename(tmp, os.path.join(out_dir, f"rank.{report['rank']}.json"))
