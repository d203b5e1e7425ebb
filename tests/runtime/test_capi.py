"""The core's C door (csrc/capi/appliance_core.h) on real ranks, through ctypes as an op
library of another framework uses it: the table's version, the process's runtime before, during
and after init, allreduce (a group, with a completion callback), allgather's core-kept output,
broadcast, and refusals as one line each."""
import pytest


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np_", [2, 3])
def test_the_c_door_on_real_ranks(run_ranks, np_):
    ranks = run_ranks(np_, "capi", timeout=150)
    for r in range(np_):
        assert ranks[r]["ok"], ranks[r]
