"""The rendezvous store (store/store.h): a real TcpStoreServer in this process, clients in
this process, in threads and in separate worker processes."""
import socket
import struct
import threading
import time

import pytest

from appliance.runtime import _core_testing as T
from appliance.runtime._core import WIRE_VERSION
from bootstrap_util import Workers

pytestmark = pytest.mark.timeout(60)

SECRET, JOB = b"\x01\x02store-secret", "store-job"


@pytest.fixture
def server():
    s = T.StoreServer("127.0.0.1", 0, SECRET, JOB)
    yield s
    del s


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c ^ 0xFFFFFFFF


def frame_header(typ: int, length: int, seq: int) -> bytes:
    h = b"APLF" + bytes([WIRE_VERSION, typ, 0, 0]) + struct.pack("<II", length, seq)
    return h + struct.pack("<I", crc32c(h))


def test_frame_header_helper_matches_the_core():
    assert frame_header(2, 3, 7) + b"abc" == T.encode_frame(2, 7, b"abc")


def client(server, secret=SECRET, job=JOB, rank=-1):
    return T.StoreClient("127.0.0.1", server.port, secret, job, rank, 5000)


def test_set_get_add_wait_in_process(server):
    c = client(server)
    for key, value in (("empty", b""), ("one", b"\x00"), ("big", bytes(range(256)) * 4096), ("k/ü", b"x" * 77)):
        c.set(key, value)
        assert c.get(key, 0) == value
    c.set("one", b"overwritten")
    assert c.get("one", 100) == b"overwritten"
    assert [c.add("n", d) for d in (1, 5, -10, 0)] == [1, 6, -4, -4]
    assert c.get("n", 0) == b"-4"
    with pytest.raises(T.BootstrapError) as ei:
        c.add("one", 1)  # not an integer
    assert ei.value.code == "invalid argument" and "'one'" in str(ei.value)
    c.wait([], 0)
    c.wait(["empty", "big", "n"], 0)


def test_timeouts_name_the_missing_keys_within_the_bound(server):
    c = client(server)
    c.set("here", b"1")
    for call, missing in ((lambda: c.get("absent", 400), ["absent"]),
                          (lambda: c.wait(["here", "gone/1", "gone/2"], 400), ["gone/1", "gone/2"])):
        t0 = time.monotonic()
        with pytest.raises(T.BootstrapError) as ei:
            call()
        took = time.monotonic() - t0
        assert ei.value.code == "timeout" and 0.35 < took < 1.5, took
        for k in missing:
            assert f"'{k}'" in str(ei.value)
        assert "'here'" not in str(ei.value)
    with pytest.raises(T.BootstrapError) as ei:
        c.get("x", -1)
    assert ei.value.code == "invalid argument"


def test_one_client_shared_by_threads(server):
    # A GET parked on the server must not hold back a SET sent later on the same connection.
    c = client(server)
    got = {}

    def getter(i):
        got[i] = c.get(f"t/{i}", 5000)

    threads = [threading.Thread(target=getter, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    for i in reversed(range(4)):
        c.set(f"t/{i}", str(i).encode())
    for t in threads:
        t.join(10)
    assert got == {i: str(i).encode() for i in range(4)}
    assert time.monotonic() - t0 < 2.0
    # And concurrent adds from threads of one client stay atomic.
    adders = [threading.Thread(target=lambda: [c.add("ctr", 1) for _ in range(50)]) for _ in range(4)]
    for t in adders:
        t.start()
    for t in adders:
        t.join(10)
    assert c.get("ctr", 0) == b"200"


WORKER = r"""
def main():
    c = T.StoreClient(ARGS["host"], ARGS["port"], bytes.fromhex(ARGS["secret"]), ARGS["job"], ARGS["rank"], 5000)
    me, n = ARGS["rank"], ARGS["n"]
    order = c.add("arrivals", 1)
    for i in range(20):
        c.add("counter", 1)
    c.set(f"rank/{me}", f"value of {me}".encode())
    c.wait([f"rank/{r}" for r in range(n)], 10000)
    seen = [c.get(f"rank/{r}", 1000).decode() for r in range(n)]
    late = c.get("late", 10000).decode()  # set by the test after everyone arrived
    c.set(f"done/{me}", b"1")
    c.wait([f"done/{r}" for r in range(n)], 10000)
    return {"order": order, "seen": seen, "late": late, "counter": int(c.get("counter", 0))}
run(main)
"""


def test_store_across_processes_with_a_refused_stranger(server, capfd):
    n = 4
    args = dict(host="127.0.0.1", port=server.port, secret=SECRET.hex(), job=JOB, n=n)
    with Workers() as w:
        good = [w.start(WORKER, dict(args, rank=r)) for r in range(n)]
        # A process without the secret, a raw client sending garbage, and one sending a
        # frame header that announces a huge payload: each is dropped; the others go on.
        intruder = w.start(WORKER, dict(args, rank=9, secret=b"not the secret".hex()))
        garbage = socket.create_connection(("127.0.0.1", server.port))
        garbage.sendall(b"GET / HTTP/1.0\r\n\r\n")
        huge = socket.create_connection(("127.0.0.1", server.port))
        huge.sendall(frame_header(2, 1 << 30, 0))  # a valid HELLO header announcing 1 GiB
        c = client(server)
        c.wait([f"rank/{r}" for r in range(n)], 10000)
        c.set("late", b"the late value")
        results = w.collect(20, good)
        bad = w.collect(10, [intruder])[0]
        for s in (garbage, huge):
            s.settimeout(5)
            try:
                assert s.recv(100) == b""  # the server hung up on it without an answer
            except ConnectionResetError:
                pass  # (or reset it, had it unread bytes)
            s.close()
    for r, res in enumerate(results):
        assert res.rc == 0 and res.result and "error" not in res.result, (r, res.stderr, res.result)
        assert res.result["seen"] == [f"value of {k}" for k in range(n)]
        assert res.result["late"] == "the late value" and res.result["counter"] == 20 * n
    assert sorted(res.result["order"] for res in results) == list(range(1, n + 1))
    assert bad.result["code"] == "authentication failed"
    assert "failed to prove the job secret" in bad.result["error"] and f":{server.port}" in bad.result["error"]
    time.sleep(0.1)
    err = capfd.readouterr().err
    refusals = [line for line in err.splitlines() if "refused a connection from 127.0.0.1:" in line]
    assert len(refusals) == 3, err  # intruder, garbage, huge header: one line each
    assert any("garbage" in line for line in refusals)
    assert client(server).get("counter", 0) == str(20 * n).encode()  # still serving


def test_client_waits_for_a_late_server_and_fails_fast_without_one():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    t0 = time.monotonic()
    with pytest.raises(T.BootstrapError) as ei:
        T.StoreClient("127.0.0.1", port, SECRET, JOB, 0, 600)
    assert ei.value.code == "timeout" and time.monotonic() - t0 < 2.0
    assert f"the store at 127.0.0.1:{port}" in str(ei.value)

    body = r"""
def main():
    c = T.StoreClient("127.0.0.1", ARGS["port"], bytes.fromhex(ARGS["secret"]), ARGS["job"], 1, 10000)
    return {"v": c.get("k", 5000).decode()}
run(main)
"""
    with Workers() as w:
        p = w.start(body, dict(port=port, secret=SECRET.hex(), job=JOB))
        time.sleep(0.7)  # the client retries meanwhile
        srv = T.StoreServer("127.0.0.1", port, SECRET, JOB)
        T.StoreClient("127.0.0.1", port, SECRET, JOB).set("k", b"ok")
        res = w.collect(15, [p])[0]
        assert res.result == {"v": "ok"}, res.stderr
        del srv


def test_server_loss_fails_pending_calls_at_once():
    srv = T.StoreServer("127.0.0.1", 0, SECRET, JOB)
    c = client(srv)
    err = {}

    def waiter():
        try:
            c.get("never", 20000)
        except T.BootstrapError as e:
            err["e"] = e

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    del srv  # the server closes every connection
    t.join(10)
    assert time.monotonic() - t0 < 3.0
    assert err["e"].code == "peer lost" and "the store at 127.0.0.1" in str(err["e"])
    with pytest.raises(T.BootstrapError):
        c.set("after", b"x")  # the client stays failed
