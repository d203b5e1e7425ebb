"""A TensorFlow script started by the process managers users already have, with no change to its
line: OpenMPI's ``mpirun`` (PMIx) and MPICH's ``mpiexec.hydra`` (PMI-1), as torch scripts are
(tests/runtime/test_mpirun_lines.py). The bootstrap is the runtime's (``config.ORIGINS``), so the
TensorFlow binding needs no detection of its own; this proves it. Each rank allreduces and
allgathers (rows 1 and 2: unequal) and writes its result in one line; every process ends. Two
ranks: each rank costs seconds of CPU importing TensorFlow, and a third proves nothing more here."""
from __future__ import annotations

import os
import re

import pytest

from fixtures import ROOT
from fixtures import mpirun_lines as ml

pytestmark = pytest.mark.timeout(240)

PROGRAM = """\
import os, sys
import tensorflow as tf
import horovod.tensorflow as hvd
hvd.init()
s = hvd.allreduce(tf.constant([float(hvd.rank() + 1)] * 4), op=hvd.Sum)
g = hvd.allgather(tf.constant([[hvd.rank()]] * (hvd.rank() + 1)))
sys.stdout.write(f"TF rank {hvd.rank()} size {hvd.size()} local {hvd.local_rank()} "
                 f"sum {s.numpy()[0]:g} gathered {g.numpy().ravel().tolist()}\\n")
sys.stdout.flush()
"""

LINES = {
    "mpirun": "mpirun -np 2 -H localhost:2 -bind-to none -x PYTHONPATH -x TF_CPP_MIN_LOG_LEVEL python tf_job.py",
    "hydra": "mpiexec.hydra -n 2 python tf_job.py",
}


@pytest.mark.parametrize("manager", sorted(LINES))
def test_a_tensorflow_script_runs_under_the_process_managers_line(tmp_path, manager, require_tool):
    require_tool("mpirun" if manager == "mpirun" else "mpiexec.hydra")
    (tmp_path / "tf_job.py").write_text(PROGRAM)
    environ = ml.env(PYTHONPATH=str(ROOT / "shim"), TF_CPP_MIN_LOG_LEVEL="2")
    if "APPLIANCE_TF_OPS_DIR" in os.environ:
        environ["APPLIANCE_TF_OPS_DIR"] = os.environ["APPLIANCE_TF_OPS_DIR"]
    rc, out, left = ml.run(LINES[manager], tmp_path, environ, timeout=200)
    assert rc == 0 and not left, out[-4000:]
    seen = sorted(re.findall(r"TF rank (\d) size 2 local (\d) sum 3 gathered \[0, 1, 1\]", out))
    assert seen == [("0", "0"), ("1", "1")], out[-4000:]
