"""benchmarks/tf_path.py runs end to end at tiny sizes: one 2-rank job gives a time and a busbw for
each of its four allreduce backends (our TF path eager and in a tf.function, our torch path,
MultiWorkerMirroredStrategy) at 4 KiB and 64 KiB, and images/s for DistributedGradientTape and
the strategy and for Keras ``fit`` with DistributedOptimizer and under the strategy (tf-keras, which
tests/run.sh installs) on a tiny model, printed and in its JSON. As root (CI) the allreduces run with
``--realtime`` (every rank's threads at SCHED_FIFO). No timed assertions.

TensorFlow is needed (the ``test`` extra installs tensorflow-cpu): without it the test skips, and
fails under --strict-prereqs (CI)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from fixtures import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_tf_path_quick(tmp_path, request):
    if importlib.util.find_spec("tensorflow") is None:
        msg = "tensorflow not installed (pip install -e '.[test]' installs tensorflow-cpu)"
        if request.config.getoption("--strict-prereqs"):
            pytest.fail(msg)
        pytest.skip(msg)
    out = tmp_path / "tf.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_", "TF_CONFIG"))}
    if os.environ.get("APPLIANCE_TF_OPS_DIR"):  # where this checkout's op library is kept
        env["APPLIANCE_TF_OPS_DIR"] = os.environ["APPLIANCE_TF_OPS_DIR"]
    env["PYTHONPATH"] = str(ROOT)
    realtime = os.geteuid() == 0  # SCHED_FIFO needs root (or CAP_SYS_NICE)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tf_path.py"), "--quick", "--json", str(out)]
                          + (["--realtime"] if realtime else []), env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads(out.read_text())
    got = {(r["backend"], r["bytes"]): r for r in result["rows"]}
    assert set(got) == {(b, s) for b in ("tf", "tf-fn", "torch", "mwms") for s in (4096, 65536)}, sorted(got)
    assert all(r["time_s"] > 0 and r["busbw_GBps"] > 0 for r in got.values())
    assert sorted(result["train"]) == ["keras-fit", "mwms", "mwms-fit", "tf-tape"]
    assert all(len(v) == 1 and v[0] > 0 for v in result["train"].values()), result["train"]
    assert "\nallreduce, float32, 2 ranks" in proc.stdout and "tf-tape/mwms: " in proc.stdout
    assert "keras-fit/mwms-fit: " in proc.stdout
    assert result["realtime"] is realtime and ("at SCHED_FIFO" in proc.stdout) is realtime
