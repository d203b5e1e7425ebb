"""TensorFlow ranks started by srun in a real two-node Slurm (``tests/fixtures/slurm.py``):
``srun -N2 -n2 python tests/ranks/slurm_tf.py`` in an allocation, the line a Slurm user writes
(``import horovod.tensorflow as hvd``; ``hvd.init()`` takes its layout from Slurm through the
runtime's table of bootstrap origins, the one torch uses). Each rank trains one step through
``DistributedGradientTape`` after ``broadcast_variables``, allreduces and allgathers, and checks every
result against numpy; the test checks every rank's report: its node (only a task slurmd started
there has that hostname), the layout, the checks, rank 0's broadcast weights on every rank; rc 0
and no process left (the fixture). ``appliance launch`` in an allocation starts its ranks with srun
too, with the launcher's contract variables, which no binding tells apart. Needs TensorFlow; the op
library is the one already built (APPLIANCE_TF_OPS_DIR), not rebuilt under the test's HOME.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

import fixtures

ROOT = Path(os.environ.get("APPLIANCE_SLURM_TEST_ROOT") or fixtures.ROOT)
PROGRAM = fixtures.RANKS / "slurm_tf.py"
PY = sys.executable

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]


def test_tensorflow_ranks_started_by_srun_train_on_both_nodes(slurm, tmp_path, request):
    if importlib.util.find_spec("tensorflow") is None:  # asked of its spec: pytest never imports TensorFlow
        why = "tensorflow not installed (pip install -e '.[test]' installs tensorflow-cpu)"
        if request.config.getoption("--strict-prereqs"):
            pytest.fail(why)
        pytest.skip(why)
    out = tmp_path / "out"
    out.mkdir()
    ops = os.environ.get("APPLIANCE_TF_OPS_DIR") or str(Path.home() / ".cache" / "appliance" / "tf-ops")
    script = '"$PY" -m appliance secret >/dev/null && srun --kill-on-bad-exit=1 -N2 -n2 "$PY" "$PROG" "$OUT" srun'
    r = slurm.run(["salloc", "-N2", "--ntasks-per-node=1", "--quiet", "sh", "-c", script], timeout=200,
                  env={"HOME": str(tmp_path), "PY": PY, "PROG": str(PROGRAM), "OUT": str(out),
                       "PYTHONPATH": f"{ROOT / 'shim'}:{ROOT}", "APPLIANCE_TF_OPS_DIR": ops,
                       "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    reps = [json.loads((out / f"srun.{k}.json").read_text()) for k in range(2)]
    for k, rep in enumerate(reps):
        assert (rep["rank"], rep["size"], rep["local_rank"], rep["local_size"], rep["cross_rank"]) == (k, 2, 0, 1, k), rep
        assert rep["hostname"] == f"node{k + 1}" == rep["slurm"]["SLURMD_NODENAME"], rep
        assert rep["slurm"]["SLURM_PROCID"] == str(k), rep
        assert rep["grad_ok"] and rep["w_ok"], rep
        assert rep["sum"] == [3.0] * 3 and rep["gathered"] == [0, 1, 1], rep
        assert rep["w0"] == reps[0]["w0"], rep  # rank 0's weights, broadcast
