"""The mutual HMAC handshake (transport/auth.h) and TCP connect, over real loopback sockets.

Some tests speak the protocol by hand from Python (frames from the core's encoder, MACs from
Python's hmac) to play a stranger, a replaying attacker or a lying acceptor.
"""
import hashlib
import hmac
import os
import socket
import struct
import threading
import time

import pytest

from appliance.runtime import _core_testing as T

pytestmark = pytest.mark.timeout(60)

HELLO, CHALLENGE, PROOF, ABORT, STORE_REQUEST, STORE_REPLY = 2, 3, 4, 7, 8, 9
STORE_CHANNEL, STORE_RANK = 2, -1


def pstr(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def hello_payload(job: bytes, rank: int, expect: int, channel: int, nonce: bytes) -> bytes:
    return struct.pack("<I", 1) + pstr(job) + struct.pack("<iii", rank, expect, channel) + pstr(nonce)


def mac(secret: bytes, label: bytes, job: bytes, c_rank: int, a_rank: int, ch: int, nc: bytes, ns: bytes) -> bytes:
    t = pstr(label) + struct.pack("<I", 1) + pstr(job) + struct.pack("<iii", c_rank, a_rank, ch) + pstr(nc) + pstr(ns)
    return hmac.new(secret, t, hashlib.sha256).digest()


def recvn(s: socket.socket, n: int) -> bytes:
    b = b""
    while len(b) < n:
        k = s.recv(n - len(b))
        if not k:
            raise EOFError(f"closed after {len(b)} of {n} bytes")
        b += k
    return b


def recv_frame(s: socket.socket):
    hdr = recvn(s, 20)
    assert hdr[:4] == b"APLF"
    length, seq = struct.unpack("<II", hdr[8:16])
    return hdr[5], seq, recvn(s, length)


def parse_challenge(p: bytes):
    rank, n = struct.unpack("<iI", p[:8])
    nonce = p[8:8 + n]
    (m,) = struct.unpack("<I", p[8 + n:12 + n])
    return rank, nonce, p[12 + n:12 + n + m]


def abort_message(p: bytes) -> str:
    (hl,) = struct.unpack("<I", p[5:9])
    (ml,) = struct.unpack("<I", p[9 + hl:13 + hl])
    return p[13 + hl:13 + hl + ml].decode()


def test_handshake_outcomes_in_process():
    ok = T.handshake_pair(b"s3cret", "job", 0, 1, 0, b"s3cret", "job", 1, 5000)
    assert ok["connector_error"] is None and ok["acceptor_error"] is None and ok["peer"] == (0, 0)
    ok = T.handshake_pair(b"k" * 200, "job", 3, 5, 1, b"k" * 200, "job", 5, 5000)
    assert ok["connector_error"] is None and ok["peer"] == (3, 1)

    bad = T.handshake_pair(b"right", "job", 0, 1, 0, b"wrong", "job", 1, 5000)
    assert bad["connector_code"] == "authentication failed"
    assert "rank 1 (127.0.0.1:" in bad["connector_error"] and "failed to prove the job secret" in bad["connector_error"]
    assert bad["acceptor_code"] == "authentication failed" and "claiming rank 0" in bad["acceptor_error"]

    job = T.handshake_pair(b"s", "job-a", 0, 1, 0, b"s", "job-b", 1, 5000)
    assert "refused us" in job["connector_error"] and "job-a" in job["connector_error"]
    assert job["acceptor_error"] is not None

    who = T.handshake_pair(b"s", "job", 0, 2, 0, b"s", "job", 1, 5000)
    assert "meant for rank 2, this is rank 1" in who["connector_error"]



def test_a_wrong_job_id_is_refused_without_telling_this_jobs_id(capfd):
    server = T.StoreServer("127.0.0.1", 0, b"sec", "real-job-7f3a")
    for claimed in (b"deadbeef", b"evil\nappliance: forged line\x1b[2J"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(T.encode_frame(HELLO, 0, hello_payload(claimed, 0, STORE_RANK, STORE_CHANNEL, os.urandom(32))))
            typ, seq, p = recv_frame(s)
            assert (typ, seq) == (ABORT, 0), typ
            said = abort_message(p)
            assert "wrong job id" in said and "real-job-7f3a" not in said, said
    del server
    err = capfd.readouterr().err
    assert "real-job-7f3a" not in err, err
    assert not any(line.startswith("appliance: forged line") for line in err.splitlines()), err


def by_hand_proof(sock, secret, job, rank, expect, ch, nonce_c=None):
    """Run the connector side by hand; returns (verdict type, payload, hello, proof frames)."""
    nonce_c = nonce_c or os.urandom(32)
    hello = T.encode_frame(HELLO, 0, hello_payload(job, rank, expect, ch, nonce_c))
    sock.sendall(hello)
    typ, seq, p = recv_frame(sock)
    assert (typ, seq) == (CHALLENGE, 0)
    a_rank, nonce_s, their = parse_challenge(p)
    assert a_rank == expect
    assert their == mac(secret, b"acceptor", job, rank, expect, ch, nonce_c, nonce_s)
    proof = T.encode_frame(PROOF, 1, pstr(mac(secret, b"connector", job, rank, expect, ch, nonce_c, nonce_s)))
    return nonce_c, hello, proof


def test_by_hand_handshake_then_store_request_restarts_at_seq_0():
    server = T.StoreServer("127.0.0.1", 0, b"sec", "j")
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        _, _, proof = by_hand_proof(s, b"sec", b"j", 7, STORE_RANK, STORE_CHANNEL)
        s.sendall(proof)
        assert recv_frame(s) == (PROOF, 1, b"\x01")
        # The store protocol numbers its frames from 0 again (auth.h).
        req = struct.pack("<QB", 42, 1) + pstr(b"k") + pstr(b"v")
        s.sendall(T.encode_frame(STORE_REQUEST, 0, req))
        typ, seq, p = recv_frame(s)
        assert (typ, seq) == (STORE_REPLY, 0) and p == struct.pack("<QB", 42, 0)
    assert T.StoreClient("127.0.0.1", server.port, b"sec", "j").get("k", 0) == b"v"


def test_replayed_and_forged_proofs_are_refused(capfd):
    server = T.StoreServer("127.0.0.1", 0, b"sec", "j")
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        nonce_c, hello, proof = by_hand_proof(s, b"sec", b"j", 0, STORE_RANK, STORE_CHANNEL)
        s.sendall(proof)
        assert recv_frame(s)[0] == PROOF
    # Replay the recorded HELLO and PROOF: the server's nonce is new, so the proof is stale.
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(hello)
        assert recv_frame(s)[0] == CHALLENGE
        s.sendall(proof)
        typ, seq, p = recv_frame(s)
        assert (typ, seq) == (ABORT, 1) and "wrong proof of the job secret" in abort_message(p)
        assert s.recv(1) == b""  # and then it hangs up
    # A proof made for another job (same secret) or another rank does not pass either.
    for job, rank in ((b"other-job", 0), (b"j", 5)):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            nonce_c = os.urandom(32)
            s.sendall(T.encode_frame(HELLO, 0, hello_payload(b"j", 0, STORE_RANK, STORE_CHANNEL, nonce_c)))
            _, _, p = recv_frame(s)
            _, nonce_s, _ = parse_challenge(p)
            forged = mac(b"sec", b"connector", job, rank, STORE_RANK, STORE_CHANNEL, nonce_c, nonce_s)
            s.sendall(T.encode_frame(PROOF, 1, pstr(forged)))
            assert recv_frame(s)[0] == ABORT
    time.sleep(0.2)
    err = capfd.readouterr().err
    assert err.count("wrong proof of the job secret") == 3


def fake_acceptor(secret: bytes, job: bytes, my_rank: int, behaviour: str):
    """A one-shot acceptor in a thread that lies in the way `behaviour` says."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)

    def serve():
        conn, _ = lst.accept()
        with conn:
            _, _, p = recv_frame(conn)
            (jl,) = struct.unpack("<I", p[4:8])
            c_rank, _, ch = struct.unpack("<iii", p[8 + jl:20 + jl])
            nonce_c = p[24 + jl:56 + jl]
            ns = os.urandom(32)
            good = mac(secret, b"acceptor", job, c_rank, my_rank, ch, nonce_c, ns)
            m = good if behaviour != "bad-mac" else bytes(32)
            conn.sendall(T.encode_frame(CHALLENGE, 0, struct.pack("<i", my_rank) + pstr(ns) + pstr(m)))
            if behaviour == "bad-mac":
                conn.recv(100)
                return
            recv_frame(conn)  # their proof
            if behaviour == "abort":
                status = struct.pack("<Bi", 5, my_rank) + pstr(b"") + pstr(b"we do not like you")
                conn.sendall(T.encode_frame(ABORT, 1, status))
            # "hang-up": close without a verdict

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return lst, t


@pytest.mark.parametrize("behaviour,expect", [
    ("abort", "refused our proof: we do not like you"),
    ("bad-mac", "failed to prove the job secret"),
    ("hang-up", "closed the connection after our proof"),
])
def test_connector_names_the_acceptor_that_refuses_or_lies(behaviour, expect):
    lst, t = fake_acceptor(b"sec", b"j", 4, behaviour)
    try:
        port = lst.getsockname()[1]
        with pytest.raises(T.BootstrapError) as ei:
            T.auth_probe("127.0.0.1", port, b"sec", "j", 1, 4, 0, 5000)
        e = ei.value
        assert e.code == "authentication failed" and e.origin_rank == 4
        assert f"rank 4 (127.0.0.1:{port})" in str(e) and expect in str(e)
    finally:
        t.join(5)
        lst.close()


def test_connect_timeout_names_target_and_errno_within_bound():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    t0 = time.monotonic()
    with pytest.raises(T.BootstrapError) as ei:
        T.connect_tcp("127.0.0.1", port, 800)
    took = time.monotonic() - t0
    assert ei.value.code == "timeout" and 0.4 < took < 2.0
    assert f"127.0.0.1:{port}" in str(ei.value) and "Connection refused" in str(ei.value)
    assert "attempts" in str(ei.value)


def test_connect_retries_until_the_listener_appears():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def late_listen():
        time.sleep(0.5)
        s.listen(1)

    t = threading.Thread(target=late_listen)
    t.start()
    try:
        t0 = time.monotonic()
        T.connect_tcp("127.0.0.1", port, 5000)
        assert 0.4 < time.monotonic() - t0 < 3.0
    finally:
        t.join()
        s.close()
