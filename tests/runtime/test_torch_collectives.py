"""appliance.torch collectives on real ranks: every op x dtype x size against torch references,
in-place/async/grouped variants, argument errors, and autograd gradients (Horovod's rules).
np=0 is a plain process without any launcher (a single rank)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_spawn import run_workers  # noqa: E402

# Small pipeline chunks so the large cases cross many chunks.
ENV = {"APPLIANCE_CHUNK_BYTES": "8192"}


def _ok(outs, np_):
    n = max(np_, 1)
    assert [o.strip().splitlines()[-1] for o in outs] == [f"OK {r}/{n}" for r in range(n)]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("np_", [0, 2, 3])
def test_collectives(np_):
    _ok(run_workers(np_, "allreduce,grouped,allgather,broadcast,alltoall,reducescatter,misc", timeout=300,
                    env=ENV), np_)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np_", [0, 2, 3])
def test_autograd(np_):
    _ok(run_workers(np_, "autograd", timeout=150, env=ENV), np_)
