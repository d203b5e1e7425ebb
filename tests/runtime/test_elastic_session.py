"""An elastic worker's session (``appliance.runtime.elastic.Session``) as pure logic: which ranks its
join request names as ``lost``. Only a peer found silent past the heartbeat timeout (the core's own
verdict, first-hand) is named; a closed link or another rank's abort names nobody, so the driver
never kills a rank on hearsay. The request itself is exercised end to end by the elastic tiers."""
from __future__ import annotations

import pytest

from appliance.runtime.elastic import Session
from appliance.runtime.errors import HorovodInternalError

pytestmark = pytest.mark.timeout(30)

ENV = {"HOROVOD_ELASTIC": "1", "APPLIANCE_ELASTIC_ADDR": "127.0.0.1:1", "APPLIANCE_ELASTIC_WORKER": "3",
       "APPLIANCE_JOB_ID": "j", "APPLIANCE_JOB_SECRET": "00ff"}


def silent(rank: int) -> HorovodInternalError:
    return HorovodInternalError(f"peer lost: no sign of life for 2 s (host down, network cut or process stopped; "
                                f"APPLIANCE_HEARTBEAT_TIMEOUT) [rank {rank}, host b]", rank, "b", "peer_lost")


def test_a_peer_silent_past_the_heartbeat_timeout_is_named_lost_until_the_next_round_starts():
    s = Session(ENV)
    s.failed(silent(2))
    s.failed(silent(2))
    assert s.lost == [2] and s.reason == "error"
    s.started()
    assert s.lost == []


@pytest.mark.parametrize("error", [
    HorovodInternalError("peer lost: connection closed by rank 2", 2, "b", "peer_lost"),
    HorovodInternalError("aborted by rank 1: out of memory", 1, "a", "aborted"),
    HorovodInternalError("no sign of life, but from nobody in particular"),
    RuntimeError("no sign of life"),
])
def test_a_closed_link_an_abort_or_an_error_without_a_rank_names_nobody(error):
    s = Session(ENV)
    s.failed(error)
    assert s.lost == [] and s.reason == "error"
