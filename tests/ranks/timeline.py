"""Worker for tests/runtime/test_timeline.py: Horovod's timeline on real ranks (numpy API).

Usage: timeline.py <case> <path>. Every rank runs the same body; rank 0 is the one that writes.
- runtime: start_timeline(path + ".first"), then start_timeline(path) after init; a grouped (fused) batch of small allreduces, one large
  allreduce, an allgather and a broadcast; stop_timeline() twice; then an allreduce that must not
  appear; results are checked.
- env: the test sets HOROVOD_TIMELINE (and _MARK_CYCLES); a few ops, then a clean shutdown.
- unwritable: start_timeline(path) where path cannot be written; reports what each rank raised,
  then checks the job still runs an allreduce.
Reports through _report: {"rank", "raised" (unwritable: "Type: message" or None), "ok"}.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _report import report  # noqa: E402

import appliance.runtime as rt  # noqa: E402

SMALL = 5           # tensors of the fused batch
LARGE = 1 << 20     # float32 elements of the large allreduce (4 MiB)


def ops(r, P):
    got = rt.grouped_allreduce([np.full(16 + i, float(r + i), np.float32) for i in range(SMALL)], op=rt.Sum, name="small")
    for i, g in enumerate(got):
        assert np.array_equal(g, np.full(16 + i, float(sum(k + i for k in range(P))), np.float32)), (i, g[:4])
    big = rt.allreduce(np.full(LARGE, float(r + 1), np.float32), op=rt.Sum, name="large")
    assert float(big[0]) == P * (P + 1) / 2 and float(big[-1]) == P * (P + 1) / 2
    g = rt.allgather(np.full((2, 3), r, np.int32), name="gather")
    assert g.shape == (2 * P, 3) and [int(v) for v in g[::2, 0]] == list(range(P))
    b = rt.broadcast(np.full(7, float(r), np.float64), root_rank=P - 1, name="bcast")
    assert np.array_equal(b, np.full(7, float(P - 1)))


def main() -> None:
    case, path = sys.argv[1], sys.argv[2]
    rt.init()
    r, P = rt.rank(), rt.size()
    out = {"rank": r, "raised": None}
    if case == "runtime":
        rt.allreduce(np.ones(4, np.float32), name="before_start")
        rt.start_timeline(path + ".first")
        rt.start_timeline(path)  # another path: the first file is completed
        rt.barrier()  # rank 1's next readiness reaches rank 0 after its timeline started
        ops(r, P)
        rt.stop_timeline()
        rt.stop_timeline()  # harmless
        rt.barrier()  # rank 1's next readiness reaches rank 0 after its timeline stopped
        rt.allreduce(np.ones(4, np.float32), name="after_stop")
    elif case == "env":
        ops(r, P)
    elif case == "unwritable":
        try:
            rt.start_timeline(path)
        except Exception as e:  # noqa: BLE001  (reported: the test checks type and text)
            out["raised"] = f"{type(e).__name__}: {e}"
        s = rt.allreduce(np.full(3, 1.0, np.float32), op=rt.Sum, name="still_runs")
        assert np.array_equal(s, np.full(3, float(P), np.float32)), s
        rt.stop_timeline()  # nothing started: harmless
    else:
        raise SystemExit(f"unknown case {case}")
    out["ok"] = True
    report(out)
    rt.shutdown()


if __name__ == "__main__":
    main()
