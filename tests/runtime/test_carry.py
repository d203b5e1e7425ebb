"""Carried allreduces on real ranks: small cached allreduces whose data travels with the tree
negotiation (APPLIANCE_CARRY_BYTES) give the bits the collective gives.

Covers, at 2 and 4 ranks: Sum, Average, Min, Max and Product, prescale and postscale, float32 and
float16, sizes below, at and above the limit, each cached (three runs under one name), with the
limit on and off: every rank's outputs equal bit for bit with it on and off, and across ranks;
with it on some ops were carried. At 2 ranks, a steady cached 4 KiB allreduce sends no DATA frame
(the runtime's stats), and with the limit at 0 it does.
"""
import pytest

ON = {"APPLIANCE_CARRY_BYTES": "8192"}
OFF = {"APPLIANCE_CARRY_BYTES": "0"}


@pytest.mark.parametrize("np_", [2, 4])
def test_carried_results_equal_the_collectives_bit_for_bit(run_ranks, np_):
    on = run_ranks(np_, "carry", "results", env=ON, timeout=120)
    off = run_ranks(np_, "carry", "results", env=OFF, timeout=120)
    for r in range(np_):
        assert on[r]["out"].keys() == off[r]["out"].keys()
        for name, bits in on[r]["out"].items():
            assert bits == off[r]["out"][name], f"rank {r}, {name}: carried {bits[:32]} vs collective {off[r]['out'][name][:32]}"
            assert bits == on[0]["out"][name], f"rank {r}, {name}: differs from rank 0"
        assert on[r]["stats"]["carried"] > 0, on[r]["stats"]
        assert off[r]["stats"]["carried"] == 0, off[r]["stats"]


def test_a_steady_small_cached_allreduce_sends_no_data_frame(run_ranks):
    n = 50
    on = run_ranks(2, "carry", "steady", n, env={"APPLIANCE_CARRY_BYTES": "65536"})
    off = run_ranks(2, "carry", "steady", n, env=OFF)
    for r in range(2):
        assert on[r]["tensors"] == n and on[r]["carried"] == n, on[r]
        assert on[r]["data_frames"] == 0, on[r]
        assert off[r]["carried"] == 0 and off[r]["data_frames"] >= n, off[r]
