"""The numpy async API keeps an op's arrays alive until the core is done with them.

A caller that drops the handle of an async op before ``synchronize`` (and lets a temporary
input go) must not let the core read or write freed memory: rank 0 drops its handles while
rank 1 holds the ops back, collects garbage and fills fresh arrays with a pattern; rank 1
checks the results (made of rank 0's inputs) and rank 0 that its pattern survived. Afterwards
the engine's handle table holds nothing (abandoned ops are released once complete).
"""
from rank_group import RankGroup


def test_dropped_async_handles_neither_corrupt_nor_crash_nor_leak(tmp_path):
    with RankGroup(2, "dropped", 20, out=tmp_path) as g:
        rcs = g.wait(timeout=120)
        assert rcs == [0, 0], f"exit codes {rcs} (-11: a rank crashed)\n" + g.all_stderr()
        for r in range(2):
            rep = g.report(r)
            assert rep is not None, g.all_stderr()
            assert rep["bad"] == [], rep["bad"]
            assert rep["kept"] == 0, rep
