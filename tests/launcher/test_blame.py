"""Whom the summary blames, given the first failed rank and its fault report (pure logic)."""
from types import SimpleNamespace

from appliance.launcher.failures import blame

HOSTS = {0: "a", 1: "b", 2: "b"}


def report(origin, kind="peer_lost", message="peer lost: rank 1 (b): no sign of life for 10 s"):
    return {"rank": 0, "host": "a", "origin_rank": origin, "origin_host": "b", "kind": kind, "message": message,
            "time": 0.0}


def test_report_naming_another_rank_blames_it_and_keeps_the_reporters_code():
    o = blame(SimpleNamespace(rank=0, host="a"), 1, report(1), HOSTS)
    assert (o.returncode, o.rank, o.host) == (1, 1, "b")
    assert o.reason == "rank 1 (host b) was lost: peer lost: rank 1 (b): no sign of life for 10 s; reported by rank 0"
    assert blame(SimpleNamespace(rank=2, host="b"), 1, report(0, "stall", ""), HOSTS).reason == \
        "rank 0 (host a) stalled; reported by rank 2"
    assert blame(SimpleNamespace(rank=2, host="b"), 1, report(1, "aborted", "x"), HOSTS).reason.startswith(
        "rank 1 (host b) failed: x;")


def test_no_report_self_unknown_or_foreign_origin_blames_the_failed_rank():
    w = SimpleNamespace(rank=1, host="b")
    for fault in (None, report(None), report(1), report(7), report(True), report("0"), {}):
        o = blame(w, -9, fault, HOSTS)
        assert (o.returncode, o.rank, o.host, o.reason) == (137, 1, "b", "rank 1 (host b) was killed by signal 9 (SIGKILL)")
    o = blame(SimpleNamespace(rank=1, host="b", cause="lost the SSH connection to b"), 255, None, HOSTS)
    assert o.reason == "rank 1 (host b) lost the SSH connection to b"


def test_a_rank_that_finished_cleanly_is_not_blamed():
    """Rank 0 shut down in order (exit 0) and took its store along; rank 1 then failed by itself and its
    report names rank 0 as the origin: the culprit is rank 1."""
    o = blame(SimpleNamespace(rank=1, host="b"), 1, report(0), HOSTS, finished=frozenset({0}))
    assert (o.rank, o.host, o.returncode) == (1, "b", 1)
