"""Channel (transport/channel.cc) over a real socketpair: one end is a C++ FrameChannel, the
other a Python socket that writes exactly the bytes a test wants (valid, torn, corrupt,
ABORT frames). Checks the message API (deadlines, partial frames), the streaming API
(small and large frames, payload into the caller's buffer) and that every failure names the
peer rank and host.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from _dataplane_helpers import T

F = T.FRAME_TYPES
C = T.CODES
PEER, HOST = 7, "hostX"


def frame(type_, payload=b"", seq=0):
    return T.encode_frame_header(F[type_] if isinstance(type_, str) else type_, len(payload), seq) + payload


def abort_payload(code, origin, host, msg):
    return T.writer_script([("status", (code, origin, host, msg))])


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    ch = T.FrameChannel(a.fileno(), PEER, 1 << 16, HOST)
    a.close()  # the channel owns a dup
    b.settimeout(5)
    yield ch, b
    ch.close()
    b.close()


def raises_core(code_name, fn, *args):
    with pytest.raises(T.CoreError) as ei:
        fn(*args)
    e = ei.value
    assert e.code == C[code_name], str(e)
    return e


def test_message_round_trip_between_two_channels():
    a, b = socket.socketpair()
    ca, cb = T.FrameChannel(a.fileno(), 1, 1 << 20), T.FrameChannel(b.fileno(), 0, 1 << 20)
    a.close(), b.close()
    try:
        payloads = [b"", b"x", bytes(range(256)) * 17, bytes(100_000)]
        for i, p in enumerate(payloads):
            ca.send_frame(F["control"] if i % 2 else F["heartbeat"], p, 1000)
        for i, p in enumerate(payloads):
            assert cb.recv_frame(1000) == (F["control"] if i % 2 else F["heartbeat"], p)
        cb.send_data(b"abc" * 2000, 1000)  # streaming and message frames share one sequence
        cb.send_frame(F["bye"], b"", 1000)
        assert ca.recv_data(6000, 1000) == b"abc" * 2000
        assert ca.recv_frame(1000) == (F["bye"], b"")
    finally:
        ca.close(), cb.close()


def test_try_recv_frame_buffers_partial_frames(pair):
    ch, raw = pair
    data = frame("control", b"hello world", 0) + frame("heartbeat", b"", 1) + frame("control", bytes(300), 2)
    got = []
    for i in range(len(data)):
        raw.sendall(data[i:i + 1])
        f = ch.try_recv_frame()
        if f is not None:
            got.append((i, f))
    assert [g[1] for g in got] == [(F["control"], b"hello world"), (F["heartbeat"], b""), (F["control"], bytes(300))]
    assert [g[0] for g in got] == [30, 50, 370]  # each frame appears with its last byte, not before
    assert ch.try_recv_frame() is None


def test_recv_frame_deadline(pair):
    ch, raw = pair
    raw.sendall(frame("control", b"abcdef")[:25])  # half a frame, then silence
    t = time.monotonic()
    e = raises_core("timeout", ch.recv_frame, 200)
    assert 0.15 < time.monotonic() - t < 2
    assert e.origin_rank == PEER and "half received" in str(e)
    raw.sendall(frame("control", b"abcdef")[25:])  # the rest completes the buffered frame
    assert ch.recv_frame(1000) == (F["control"], b"abcdef")


@pytest.mark.parametrize("corrupt, words", [
    (lambda h: b"XX" + h[2:], "magic"),
    (lambda h: h[:5] + b"\x63" + h[6:], "checksum"),
    (lambda h: h[:-1] + bytes([h[-1] ^ 0xFF]), "checksum"),
    (lambda h: T.encode_frame_header(F["control"], 5, 1), "sequence 1, expected 0"),
    (lambda h: T.encode_frame_header(F["control"], 1 << 30, 0), "exceeds the limit"),
])
def test_decode_errors_name_the_peer(pair, corrupt, words):
    ch, raw = pair
    raw.sendall(corrupt(T.encode_frame_header(F["control"], 5, 0)) + b"12345")
    e = raises_core("protocol error", ch.recv_frame, 1000)
    assert e.origin_rank == PEER and e.host == HOST
    assert words in str(e) and f"rank {PEER} ({HOST})" in str(e)


@pytest.mark.parametrize("n", [0, 1, 4096, 4097, 50_000])
def test_streaming_receive_small_and_large_frames_in_pieces(pair, n):
    ch, raw = pair
    payload = bytes((i * 7) % 251 for i in range(n))
    data = frame("data", payload)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("v", ch.recv_data(n, 5000)))
    t.start()
    for i in range(0, len(data), 997):  # torn across header/payload boundaries
        raw.sendall(data[i:i + 997])
        time.sleep(0.001)
    t.join(5)
    assert out["v"] == payload


def test_streaming_send_writes_valid_frames(pair):
    ch, raw = pair
    for i, n in enumerate([0, 10, 4096, 9000]):
        ch.send_data(bytes([i]) * n, 1000)
        hdr = raw.recv(20, socket.MSG_WAITALL)
        d = T.decode_frame_header(hdr, i, 1 << 20)
        assert (d["error"], d["type"], d["length"]) == ("none", F["data"], n)
        body = b""
        while len(body) < n:
            body += raw.recv(n - len(body))
        assert body == bytes([i]) * n


def test_abort_where_data_expected_rethrows_the_origin_status(pair):
    ch, raw = pair
    raw.sendall(frame("abort", abort_payload(C["peer lost"], 3, "hostC", "connection reset while receiving")))
    e = raises_core("peer lost", ch.recv_data, 100, 1000)
    assert (e.origin_rank, e.host) == (3, "hostC") and "connection reset" in str(e)


def test_abort_in_a_large_receive_and_split_across_writes(pair):
    ch, raw = pair
    data = frame("abort", abort_payload(C["aborted"], 4, "h4", "x" * 5000))
    out = {}

    def rx():
        try:
            ch.recv_data(100_000, 5000)
        except T.CoreError as e:
            out["e"] = e

    t = threading.Thread(target=rx)
    t.start()
    for i in range(0, len(data), 1000):
        raw.sendall(data[i:i + 1000])
        time.sleep(0.001)
    t.join(5)
    assert out["e"].code == C["aborted"] and out["e"].origin_rank == 4


@pytest.mark.parametrize("data, words", [
    (frame("data", b"abc"), "data frame of 3 bytes where 5 were expected"),
    (frame("control", b"abcde"), "unexpected control frame"),
    (frame("abort", b"\x01\x02"), "malformed abort frame from rank 7"),
    (frame("abort", abort_payload(0, 1, "", "")), "ok status"),
])
def test_streaming_receive_rejects_unexpected_frames(pair, data, words):
    ch, raw = pair
    raw.sendall(data)
    e = raises_core("protocol error", ch.recv_data, 5, 1000)
    assert e.origin_rank == PEER and words in str(e)


def test_peer_closing_is_peer_lost_naming_the_rank(pair):
    ch, raw = pair
    raw.sendall(frame("data", b"abc")[:10])
    raw.close()
    e = raises_core("peer lost", ch.recv_data, 3, 1000)
    assert e.origin_rank == PEER and f"rank {PEER} ({HOST})" in str(e)


def test_send_timeout_without_reader_then_channel_refuses(pair):
    ch, raw = pair
    big = bytes(8 << 20)  # far above the socket buffers, and nobody reads
    t = time.monotonic()
    e = raises_core("timeout", ch.send_frame, F["control"], big, 100)
    assert 0.08 < time.monotonic() - t < 2 and e.origin_rank == PEER
    # Part of the frame is on the wire: the stream is torn and the channel says so.
    e = raises_core("internal error", ch.send_frame, F["control"], b"x", 100)
    assert "timed out in the middle of a frame" in str(e)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=120))
def test_fuzz_channel_on_random_stream(data):
    a, b = socket.socketpair()
    ch = T.FrameChannel(a.fileno(), PEER, 64)
    a.close()
    try:
        # Random bytes, sometimes behind a valid frame: only frames, "need more" or protocol errors.
        b.sendall(frame("control", b"ok") + data if data[:1] == b"\x00" else data)
        for _ in range(8):
            try:
                f = ch.try_recv_frame()
            except T.CoreError as e:
                assert e.code == C["protocol error"] and e.origin_rank == PEER
                break
            if f is None:
                break
            assert len(f[1]) <= 64
    finally:
        ch.close()
        b.close()
