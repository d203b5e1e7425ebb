"""Rank-agnostic worker for tests/runtime/test_capi.py: the core's C door
(csrc/capi/appliance_core.h) driven through ctypes, as a framework's op library drives it.

Usage: capi.py. Runs every check in order on every rank and reports ``{"ok": true, ...}``
through ``_report``; a failed check raises (traceback on stderr, exit non-zero). The ctypes
structures below mirror the header field by field.
"""
import ctypes as C
import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import report  # noqa: E402

import appliance.runtime as rt  # noqa: E402
from appliance.runtime import _core  # noqa: E402

I32, I64, U32, U64, D = C.c_int32, C.c_int64, C.c_uint32, C.c_uint64, C.c_double
ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL = 0, 1, 2, 3
FLOAT32, INT64 = 7, 4
SUM, AVERAGE, MAX = 1, 0, 4


class Request(C.Structure):
    _fields_ = [("kind", I32), ("reduce_op", I32), ("prescale", D), ("postscale", D), ("root", I32),
                ("process_set", I32), ("name", C.c_char_p), ("data", C.c_void_p), ("out", C.c_void_p),
                ("dtype", I32), ("ndim", I32), ("shape", C.POINTER(I64)), ("splits", C.POINTER(I64)),
                ("nsplits", I32), ("device", I32), ("stream", U64)]


class Status(C.Structure):
    _fields_ = [("ok", I32), ("code", I32), ("origin_rank", I32), ("code_name", C.c_char_p),
                ("origin_host", C.c_char_p), ("message", C.c_char_p)]


class Output(C.Structure):
    _fields_ = [("ndim", I32), ("shape", C.POINTER(I64)), ("data", C.c_void_p), ("bytes", C.c_size_t),
                ("nsplits", I32), ("splits", C.POINTER(I64)), ("value", I64)]


class Topology(C.Structure):
    _fields_ = [(n, I32) for n in ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")]


DONE = C.CFUNCTYPE(None, C.c_void_p, I32, C.c_void_p, C.POINTER(Status))


class Api(C.Structure):
    _fields_ = [("abi_version", U32), ("size_of", U32),
                ("topology", C.CFUNCTYPE(I32, C.POINTER(Topology))),
                ("process_set", C.CFUNCTYPE(I32, I32, C.POINTER(I32), C.POINTER(I32))),
                ("submit", C.CFUNCTYPE(I32, C.POINTER(Request), I32, DONE, C.c_void_p, C.POINTER(C.c_void_p),
                                       C.c_char_p, C.c_size_t)),
                ("poll", C.CFUNCTYPE(I32, C.c_void_p)),
                ("wait", C.CFUNCTYPE(None, C.c_void_p, C.POINTER(Status))),
                ("output", C.CFUNCTYPE(None, C.c_void_p, C.POINTER(Output))),
                ("release", C.CFUNCTYPE(None, C.c_void_p))]


def api() -> Api:
    get = C.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = C.c_void_p, [C.py_object, C.c_char_p]
    return Api.from_address(get(_core.c_api(), b"appliance_core_api"))


def request(kind, a, name, out=None, op=SUM, root=0, prescale=0.0, postscale=0.0, dtype=FLOAT32):
    shape = (I64 * max(a.ndim, 1))(*a.shape)
    r = Request(kind=kind, reduce_op=op, prescale=prescale, postscale=postscale, root=root, name=name.encode(),
                data=a.ctypes.data, out=0 if out is None else out.ctypes.data, dtype=dtype, ndim=a.ndim,
                shape=shape, device=-1)
    r._keep = shape
    return r


def submit_wait(A, reqs):
    """Submit without a callback, wait for each: [(status, op)] (the caller releases)."""
    arr = (Request * len(reqs))(*reqs)
    ops = (C.c_void_p * len(reqs))()
    err = C.create_string_buffer(512)
    n = A.submit(arr, len(reqs), DONE(), None, ops, err, 512)
    assert n == len(reqs), err.value
    out = []
    for op in ops:
        st = Status()
        A.wait(op, C.byref(st))
        assert st.ok, st.message
        out.append(op)
    return out


def main() -> None:
    A = api()
    assert A.abi_version == 1 and A.size_of == C.sizeof(Api), (A.abi_version, A.size_of, C.sizeof(Api))
    err = C.create_string_buffer(512)
    t = Topology()
    assert A.topology(C.byref(t)) == 0  # before init: no runtime
    one = np.ones(3, np.float32)
    n = A.submit((Request * 1)(request(ALLREDUCE, one, "early", out=one)), 1, DONE(), None, (C.c_void_p * 1)(), err, 512)
    assert n == 0 and b"hvd.init()" in err.value, err.value

    rt.init()
    rank, size = rt.rank(), rt.size()
    assert A.topology(C.byref(t)) == 1 and (t.rank, t.size, t.local_rank) == (rank, size, rt.local_rank())
    ps_size, ps_rank = I32(), I32()
    assert A.process_set(0, C.byref(ps_size), C.byref(ps_rank)) == 1 and (ps_size.value, ps_rank.value) == (size, rank)
    assert A.process_set(77, None, None) == -1
    inputs = [np.arange(1000, dtype=np.float32) * (r + 1) for r in range(size)]

    # allreduce with a callback, in place, prescaled: the callback fires once, off this thread
    fired, threads = [], []
    ev = threading.Event()

    @DONE
    def done(user, index, op, status):
        fired.append((index, status.contents.ok, status.contents.message))
        threads.append(threading.get_ident())
        A.release(op)
        if len(fired) == 3:
            ev.set()

    bufs = [inputs[rank].copy() for _ in range(3)]
    reqs = [request(ALLREDUCE, b, f"cb.{i}", out=b, op=SUM, prescale=2.0) for i, b in enumerate(bufs)]
    n = A.submit((Request * 3)(*reqs), 3, done, None, None, err, 512)  # one group of three
    assert n == 3, err.value
    assert ev.wait(60), fired
    assert sorted(i for i, _, _ in fired) == [0, 1, 2] and all(ok for _, ok, _ in fired), fired
    want = 2 * sum(inputs)
    for b in bufs:
        assert np.array_equal(b, want), (b[:4], want[:4])

    # allreduce into another buffer, Average, without a callback
    src, dst = inputs[rank].copy(), np.zeros(1000, np.float32)
    (op,) = submit_wait(A, [request(ALLREDUCE, src, "avg", out=dst, op=AVERAGE)])
    A.release(op)
    assert np.allclose(dst, sum(inputs) / size) and np.array_equal(src, inputs[rank])

    # allgather: rows differ per rank; the output's shape and bytes come from the core
    rows = np.full((rank + 1, 2), rank, np.int64)
    (op,) = submit_wait(A, [request(ALLGATHER, rows, "gather", dtype=INT64)])
    o = Output()
    A.output(op, C.byref(o))
    shape = tuple(o.shape[i] for i in range(o.ndim))
    got = np.frombuffer(C.string_at(o.data, o.bytes), np.int64).reshape(shape)
    A.release(op)
    assert np.array_equal(got, np.concatenate([np.full((r + 1, 2), r, np.int64) for r in range(size)])), got

    # broadcast from the last rank
    b = np.full(5, rank, np.float32)
    (op,) = submit_wait(A, [request(BROADCAST, b, "bcast", out=b, root=size - 1)])
    A.release(op)
    assert np.all(b == size - 1), b

    # refusals: a name in flight, an unknown dtype; each one line, nothing enqueued
    x = np.zeros(4, np.float32)
    ops = (C.c_void_p * 1)()
    assert A.submit((Request * 1)(request(ALLREDUCE, x, "dup", out=x)), 1, DONE(), None, ops, err, 512) == 1
    n = A.submit((Request * 1)(request(ALLREDUCE, x, "dup", out=x)), 1, DONE(), None, (C.c_void_p * 1)(), err, 512)
    assert n == 0 and b"already in flight" in err.value, err.value
    st = Status()
    A.wait(ops[0], C.byref(st))
    A.release(ops[0])
    n = A.submit((Request * 1)(request(ALLREDUCE, x, "bad", out=x, dtype=42)), 1, DONE(), None, (C.c_void_p * 1)(), err, 512)
    assert n == 0 and b"dtype" in err.value, err.value

    # shutdown: a pending callback op (a name no other rank submits) fails; then no runtime
    lonely, failed = np.zeros(2, np.float32), []
    ev.clear()

    @DONE
    def fail(user, index, op, status):
        failed.append((status.contents.ok, status.contents.code))
        A.release(op)
        ev.set()

    assert A.submit((Request * 1)(request(ALLREDUCE, lonely, f"lonely.{rank}", out=lonely)), 1, fail, None, None,
                    err, 512) == 1
    rt.shutdown()
    assert ev.wait(30) and failed and failed[0][0] == 0, failed
    assert A.topology(C.byref(t)) == 0
    n = A.submit((Request * 1)(request(ALLREDUCE, x, "late", out=x)), 1, DONE(), None, (C.c_void_p * 1)(), err, 512)
    assert n == 0 and b"hvd.init()" in err.value
    report({"ok": True, "rank": rank, "callback_threads": len(set(threads))})


if __name__ == "__main__":
    main()
