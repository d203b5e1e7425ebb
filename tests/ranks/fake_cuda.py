"""Worker for tests/runtime/test_cuda_engine.py: the engine's CUDA path with the stand-in CUDA
runtime (its "device" memory is host memory), through the numpy-level engine API.

Usage: fake_cuda.py staging|nccl_fails|solo (solo: one rank on the stand-in NCCL that works
for one rank, so the NCCL backend's own plumbing runs: fusion buffer, device allocator,
completion events). Env: FAKE_CUDART (the stand-in's path),
FAKE_DISTINCT_GPUS=1 (each rank its own PCI bus id; else all ranks share one GPU).
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _report import report  # noqa: E402

from appliance.runtime import devices  # noqa: E402

devices.cudart_candidates = lambda: [os.environ["FAKE_CUDART"]]
RANK = int(os.environ["HOROVOD_RANK"])
if os.environ.get("FAKE_DISTINCT_GPUS") == "1":
    os.environ["FAKE_CUDA_BUS"] = f"0000:{RANK + 1:02x}:00"

import appliance.runtime as rt  # noqa: E402
from appliance.runtime import engine  # noqa: E402
from appliance.runtime.engine import Kind, TensorDesc, numpy_dtype  # noqa: E402
from appliance.runtime.errors import HorovodInternalError  # noqa: E402


def dev(a, out=None):
    """Describe a numpy array (and the one receiving the result) as memory of CUDA device 0 (the
    stand-in's device memory)."""
    return TensorDesc(a.ctypes.data, numpy_dtype(a.dtype), tuple(a.shape), 0 if out is None else out.ctypes.data,
                      device=0)


def submit_dev(kind, name, inp, out=None, **kw):
    """``engine.submit`` of device memory; ``kw``: ``engine.request``'s (op, scales, root, splits)."""
    return engine.submit(engine.request(kind, **kw), name, dev(inp, out))


def staging(P):
    checked = 0
    keep = []

    def submit(kind, name, inp, out=None, **kw):
        keep.append((inp, out))
        return submit_dev(kind, name, inp, out, **kw)

    # A lone allreduce, then a batch of small ones (fused) with Average and scale factors.
    x = np.arange(1000, dtype=np.float32) + RANK
    engine.wait(submit(Kind.ALLREDUCE, "lone", x, x, op=rt.Sum))
    assert np.allclose(x, P * np.arange(1000) + sum(range(P))), x[:4]
    checked += 1
    outs, hs = [], []
    for i in range(8):
        a = np.full(17 + i, float(RANK + i), dtype=np.float64)
        o = np.empty_like(a)
        outs.append((i, o))
        hs.append(submit(Kind.ALLREDUCE, f"small.{i}", a, o, op=rt.Average, prescale=2.0, postscale=0.5))
    for h in hs:
        engine.wait(h)
    for i, o in outs:
        assert np.allclose(o, np.mean([r + i for r in range(P)])), (i, o[:3])
        checked += 1
    # int16 (NCCL has no int16 reduction: staged per entry whatever the job's path).
    s = np.full(5, RANK + 1, dtype=np.int16)
    engine.wait(submit(Kind.ALLREDUCE, "i16", s, s, op=rt.Max))
    assert (s == P).all()
    checked += 1
    # allgather with a different first dimension per rank: output in host memory.
    g = np.full((RANK + 1, 3), RANK, dtype=np.int32)
    r = engine.wait(submit(Kind.ALLGATHER, "gather", g))
    got = r.output.view(np.int32).reshape(r.shape)
    assert got.shape == (sum(range(1, P + 1)), 3)
    assert [int(v) for v in got[:, 0]] == [q for q in range(P) for _ in range(q + 1)]
    checked += 1
    # broadcast from the last rank, in place.
    b = np.full(33, RANK, dtype=np.float16)
    engine.wait(submit(Kind.BROADCAST, "bcast", b, b, root=P - 1))
    assert (b == P - 1).all()
    checked += 1
    # alltoall with splits: rank r sends p+1 rows to rank p.
    rows = [p + 1 for p in range(P)]
    t = np.concatenate([np.full((rows[p], 2), 10 * RANK + p, dtype=np.int64) for p in range(P)])
    r = engine.wait(submit(Kind.ALLTOALL, "a2a", t, splits=rows))
    got = r.output.view(np.int64).reshape(r.shape)
    assert list(r.splits) == [RANK + 1] * P
    assert [int(v) for v in got[:, 0]] == [10 * q + RANK for q in range(P) for _ in range(RANK + 1)]
    checked += 1
    # reducescatter of 5 rows (uneven over 2 and 3 ranks).
    m = np.ones((5, 4), dtype=np.float32) * (RANK + 1)
    r = engine.wait(submit(Kind.REDUCESCATTER, "rs", m, op=rt.Sum))
    got = r.output.view(np.float32).reshape(r.shape)
    assert got.shape[0] == 5 // P + (1 if RANK < 5 % P else 0) and np.allclose(got, sum(range(1, P + 1)))
    checked += 1
    # Adasum (always through host memory): orthogonal inputs add up.
    ada = np.zeros(4 * P, dtype=np.float32)
    ada[4 * RANK:4 * RANK + 4] = RANK + 1
    engine.wait(submit(Kind.ALLREDUCE, "adasum", ada, ada, op=rt.Adasum))
    assert np.array_equal(ada, np.repeat(np.arange(1, P + 1, dtype=np.float32), 4)), ada
    checked += 1
    # Host tensors still run on the CPU backend between CUDA ones.
    assert np.allclose(rt.allreduce(np.ones(3), op=rt.Sum), P)
    checked += 1
    return checked


def solo():
    """One rank through the NCCL backend; outputs the core sizes come from a numpy allocator."""
    engine.use_device_allocator(lambda device, nbytes, stream: (lambda a: (a.ctypes.data, a))(np.empty(nbytes, np.uint8)))
    checked = 0
    keep = []

    def run(kind, name, inp, out=None, **kw):
        keep.append((inp, out))
        # stream 0: returns once queued on the (stand-in) device, the default stream ordered after it
        return engine.wait(submit_dev(kind, name, inp, out, **kw), 0)

    x = np.arange(10, dtype=np.float32)
    o = np.zeros_like(x)
    run(Kind.ALLREDUCE, "sum", x, o, op=rt.Sum)
    assert (o == x).all()
    run(Kind.ALLREDUCE, "scaled", x, o, op=rt.Sum, prescale=0.5, postscale=3.0)
    assert np.allclose(o, x * 1.5)
    # staged (a scaled sum on one rank): a float16 tensor is scaled by the factor rounded to
    # float16, as on the device, not by the float32 factor the host path would use
    h = np.arange(1, 200, dtype=np.float16)
    ho = np.zeros_like(h)
    run(Kind.ALLREDUCE, "scaled16", h, ho, op=rt.Sum, prescale=0.1)
    assert (ho == (h.astype(np.float32) * np.float32(np.float16(0.1))).astype(np.float16)).all()
    hs, outs = [], []
    for i in range(6):  # fused on the device
        a = np.full(5 + i, float(i), dtype=np.float64)
        b = np.zeros_like(a)
        keep.append((a, b))
        outs.append((i, b))
        # unscaled: a one-rank job scales sums on the host, and this batch is to fuse on the device
        hs.append(submit_dev(Kind.ALLREDUCE, f"f.{i}", a, b, op=rt.Average))
    for h in hs:
        engine.wait(h)
    for i, b in outs:
        assert (b == float(i)).all(), (i, b)
    checked += 8
    s16 = np.arange(4, dtype=np.int16)
    run(Kind.ALLREDUCE, "i16", s16, s16, op=rt.Sum)  # staged: NCCL has no int16 reductions
    assert (s16 == np.arange(4)).all()
    g = np.arange(6, dtype=np.int32).reshape(3, 2)
    r = run(Kind.ALLGATHER, "ag", g)
    assert isinstance(r.output, np.ndarray) and (r.output.view(np.int32).reshape(r.shape) == g).all()
    b = np.arange(7, dtype=np.float16)
    bo = np.zeros_like(b)
    run(Kind.BROADCAST, "bc", b, bo, root=0)
    assert (bo == b).all()
    r = run(Kind.ALLTOALL, "a2a", g, splits=[3])
    assert list(r.splits) == [3] and (r.output.view(np.int32).reshape(r.shape) == g).all()
    m = np.ones((4, 3), dtype=np.float32)
    r = run(Kind.REDUCESCATTER, "rs", m, op=rt.Sum, prescale=4.0)
    assert np.allclose(r.output.view(np.float32).reshape(r.shape), 4.0)
    ada = np.arange(6, dtype=np.float32)
    run(Kind.ALLREDUCE, "adasum", ada, ada, op=rt.Adasum)  # staged: NCCL has no Adasum
    assert (ada == np.arange(6)).all()
    checked += 6
    return checked


def main():
    case = sys.argv[1]
    rt.init()
    P = rt.size()
    out = {"rank": RANK}
    t0 = time.monotonic()
    try:
        if case == "staging":
            out["checked"] = staging(P)
        elif case == "solo":
            out["checked"] = solo()
            out["cuda_path"] = list(engine.cuda_path())
            import ctypes
            fake = ctypes.CDLL(os.environ["FAKE_CUDART"])
            out["stream_waits"] = fake.fake_stream_waits()
            out["fused_entries"] = engine.current().core.stats()["fused_entries"]
            # the last op returns as soon as it is queued; shutdown must let it finish first
            x = np.ones(10, dtype=np.float32)
            engine.wait(submit_dev(Kind.ALLREDUCE, "last", x, x, op=rt.Sum), 0)
            rt.shutdown()
            out["events_outstanding"] = fake.fake_events_outstanding()
        elif case == "nccl_fails":
            x = np.ones(10, dtype=np.float32)
            engine.wait(submit_dev(Kind.ALLREDUCE, "x", x, x, op=rt.Sum))
        out["ok"] = True
    except HorovodInternalError as e:
        out["error"] = str(e)
        out["error_after_s"] = time.monotonic() - t0
    if case == "staging":
        out["cuda_path"] = list(engine.cuda_path())
    report(out)
    rt.shutdown()


if __name__ == "__main__":
    main()
