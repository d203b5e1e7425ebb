"""appliance.torch helpers and lifecycle on real ranks: broadcast_parameters, optimizer state,
objects, init -> shutdown -> init, build probes, and a peer that dies."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_spawn import run_workers  # noqa: E402


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np_", [0, 2, 3])
def test_functions_probes_lifecycle(np_):
    outs = run_workers(np_, "functions,probes,lifecycle", timeout=150)
    n = max(np_, 1)
    assert [o.strip().splitlines()[-1] for o in outs] == [f"OK {r}/{n}" for r in range(n)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("np_", [2, 3])
def test_peer_loss_raises_everywhere(np_):
    outs = run_workers(np_, "peer_loss", timeout=90, expect_codes=[0] * (np_ - 1) + [3])
    for o in outs[:-1]:
        assert "peer loss seen" in o and o.strip().endswith(f"/{np_}")


@pytest.mark.timeout(60)
def test_spawn_helper_kills_what_it_started():
    pids = []
    with pytest.raises(AssertionError, match="timed out"):
        run_workers(2, "sleep", timeout=3, pids=pids)
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)  # the whole process group is gone
