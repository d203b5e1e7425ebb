"""appliance.tensorflow in one process, without a launcher: ``import horovod.tensorflow as hvd``
through the shim is ``appliance.tensorflow`` itself, and torch and TensorFlow in one process share
one runtime (hvd.init() of either is the other's). Each check runs in a fresh interpreter.
Needs TensorFlow (conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from fixtures import ROOT



def ok(code: str, timeout: float = 240) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("HOROVOD_", "APPLIANCE_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT / "shim"), str(ROOT)]), TF_CPP_MIN_LOG_LEVEL="2")
    if "APPLIANCE_TF_OPS_DIR" in os.environ:
        env["APPLIANCE_TF_OPS_DIR"] = os.environ["APPLIANCE_TF_OPS_DIR"]
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd="/")
    assert p.returncode == 0, p.stderr[-4000:]
    return p.stdout


@pytest.mark.timeout(300)
def test_the_shim_is_the_module_and_torch_shares_the_runtime():
    pytest.importorskip("torch")
    ok("""
        import torch, tensorflow as tf
        import appliance.tensorflow as a, horovod.tensorflow as hvd, horovod.tensorflow.mpi_ops as mo
        import horovod.torch as ht
        assert hvd is a and hvd.init is a.init and mo is a.mpi_ops and hvd.Average == ht.Average == 0
        ht.init()  # torch's init: TensorFlow's ops run on the same runtime
        assert hvd.is_initialized() and hvd.size() == 1 and hvd.rank() == 0
        assert hvd.allreduce(tf.constant([1.0, 2.0])).numpy().tolist() == [1.0, 2.0]
        assert ht.allreduce(torch.tensor([3.0])).tolist() == [3.0]
        assert int(hvd.size_op()) == 1
        hvd.shutdown()
        assert not ht.is_initialized()
        try:
            hvd.allreduce(tf.ones(2))
        except ValueError as e:
            assert "init" in str(e)
        else:
            raise AssertionError("allreduce after shutdown did not raise")
    """)
