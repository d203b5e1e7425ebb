"""A killed rank under appliance.tensorflow: ranks started directly (no launcher, which would
stop the survivors), the last one SIGKILLed after a first allreduce; every survivor's next
allreduce fails with tf.errors.UnknownError naming the dead rank within seconds, and every
process ends. Needs TensorFlow (conftest.py)."""
import sys
from pathlib import Path

import pytest

from fixtures import RANKS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rank_group import RankGroup  # noqa: E402


@pytest.mark.timeout(300)
def test_a_killed_rank_is_an_error_on_every_survivor(tmp_path):
    n = 3
    with RankGroup(n, "killed", out=tmp_path, worker=RANKS / "tf_hvd.py",
                   env={"OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}) as g:
        codes = g.wait(240)
        assert codes[n - 1] == -9, (codes, g.stderr(n - 1)[-2000:])
        for r in range(n - 1):
            rep = g.report(r)
            assert codes[r] == 0 and rep and rep["ok"], (r, codes, g.stderr(r)[-3000:])
            assert f"rank {n - 1}" in rep["error"], rep["error"]
            assert rep["seconds"] < 15, rep
