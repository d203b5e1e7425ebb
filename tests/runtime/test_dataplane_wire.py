"""Frame header codec (wire/frame.h) and payload Reader/Writer (wire/codec.h): one unit test
per DecodeError, a CRC-32C test vector, and hypothesis fuzzing of both decoders on random
bytes (they may only return an error / raise CoreError(protocol), never crash or
over-allocate).
"""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings, strategies as st

from _dataplane_helpers import T

from appliance.runtime._core import WIRE_VERSION

DATA = T.FRAME_TYPES["data"]
PROTOCOL = T.CODES["protocol error"]


def header(type_=DATA, length=10, seq=0, magic=b"APLF", version=WIRE_VERSION, reserved=0, crc=None):
    body = magic + bytes([version, type_]) + struct.pack("<HII", reserved, length, seq)
    if crc is None:
        crc = T.crc32c(body)
    return body + struct.pack("<I", crc)


def decode(b, seq=0, max_len=1000):
    return T.decode_frame_header(b, seq, max_len)


def test_crc32c_known_vector():
    assert T.crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value
    assert T.crc32c(b"") == 0
    # RFC 3720's 32-byte vectors: whole 8-byte words (the hardware path) and a table-only tail
    assert T.crc32c(bytes(32)) == 0x8A9136AA
    assert T.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert T.crc32c(bytes(range(32))) == 0x46DD794E
    assert T.crc32c(bytes(range(31, -1, -1))) == 0x113FDB5C
    data = bytes(range(7, 60))
    for cut in range(len(data) + 1):  # a seed continues a checksum, whatever the split
        assert T.crc32c(data[cut:], T.crc32c(data[:cut])) == T.crc32c(data), cut


def test_encode_matches_layout_and_decodes():
    h = T.encode_frame_header(T.FRAME_TYPES["control"], 77, 5)
    assert h == header(T.FRAME_TYPES["control"], 77, 5)
    d = decode(h, seq=5)
    assert (d["error"], d["type"], d["length"], d["seq"]) == ("none", T.FRAME_TYPES["control"], 77, 5)


def test_each_decode_error():
    cases = {
        "bad_magic": header(magic=b"XPLF"),
        "bad_version": header(version=WIRE_VERSION + 1),
        "bad_crc": header()[:-1] + bytes([header()[-1] ^ 1]),
        "bad_type": header(type_=0),
        "reserved": header(reserved=1),
        "too_long": header(length=1001),
        "bad_seq": header(seq=3),
    }
    for want, b in cases.items():
        d = decode(b)
        assert d["error"] == want, (want, d)
        assert d["describe"] and d["describe"] != "ok"
    assert decode(header(type_=11))["error"] == "bad_type"
    assert decode(header()[:19])["error"] == "bad_magic"  # a short header counts as torn
    d = decode(header(length=5000), max_len=4096)
    assert (d["got"], d["want"]) == (5000, 4096) and "5000" in d["describe"]
    d = decode(header(seq=9), seq=4)
    assert (d["got"], d["want"]) == (9, 4)
    assert decode(header(length=1000))["error"] == "none"  # the bound is inclusive


def test_crc_covers_every_header_byte():
    good = header(length=3, seq=0)
    for i in range(16):
        b = bytearray(good)
        b[i] ^= 0x10
        assert decode(bytes(b))["error"] in ("bad_magic", "bad_crc"), i


# Random bytes mostly fail at the magic; near-valid headers (random fields, right or wrong CRC,
# a few flipped bytes) reach every later check.
near_valid = st.builds(
    lambda t, n, q, v, r, good_crc, flips: _flip(
        header(t, n, q, version=v, reserved=r, crc=None if good_crc else 0x12345678), flips),
    st.integers(0, 255), st.one_of(st.integers(0, 2000), st.integers(0, 2**32 - 1)),
    st.one_of(st.integers(0, 3), st.integers(0, 2**32 - 1)), st.sampled_from([WIRE_VERSION] * 3 + [0, WIRE_VERSION + 1]),
    st.sampled_from([0, 0, 0, 1, 256]), st.booleans(), st.lists(st.tuples(st.integers(0, 19), st.integers(1, 255)),
                                                                 max_size=2))


def _flip(b, flips):
    b = bytearray(b)
    for i, x in flips:
        b[i] ^= x
    return bytes(b)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(min_size=0, max_size=40), near_valid), st.one_of(st.integers(0, 3), st.integers(0, 2**32 - 1)),
       st.one_of(st.integers(0, 2000), st.integers(0, 2**32 - 1)))
def test_fuzz_decode_frame_header(data, seq, max_len):
    d = T.decode_frame_header(data, seq, max_len)
    assert d["error"] in ("none", "bad_magic", "bad_version", "bad_crc", "bad_type", "reserved", "too_long",
                          "bad_seq")
    if d["error"] == "none":  # anything accepted re-encodes to the same bytes
        assert T.encode_frame_header(d["type"], d["length"], d["seq"]) == data[:20]
        assert d["length"] <= max_len and d["seq"] == seq


FIELDS = {
    "u8": st.integers(0, 255),
    "u32": st.integers(0, 2**32 - 1),
    "u64": st.integers(0, 2**64 - 1),
    "i32": st.integers(-(2**31), 2**31 - 1),
    "i64": st.integers(-(2**63), 2**63 - 1),
    "f64": st.floats(allow_nan=False),
    "str": st.binary(max_size=40),
    "bytes": st.binary(max_size=40),
    "i64s": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=8),
    "status": st.tuples(st.integers(0, 9), st.integers(-1, 1000), st.text(max_size=10), st.text(max_size=20)),
}
field = st.sampled_from(sorted(FIELDS)).flatmap(lambda k: st.tuples(st.just(k), FIELDS[k]))


@settings(max_examples=200, deadline=None)
@given(st.lists(field, max_size=12))
def test_writer_reader_round_trip(items):
    data = T.writer_script(items)
    got = T.reader_script(data, [k for k, _ in items] + ["done"])
    for (k, v), g in zip(items, got):
        if k == "status":
            assert g == (v[0], v[1], v[2], v[3])
        else:
            assert g == v, k


def test_reader_errors_name_the_problem():
    with pytest.raises(T.CoreError) as ei:
        T.reader_script(b"\x01\x02", ["u32"])
    assert ei.value.code == PROTOCOL and "truncated" in str(ei.value)
    with pytest.raises(T.CoreError) as ei:
        T.reader_script(T.writer_script([("str", b"x" * 20)]), ["str:10"])
    assert "exceeds" in str(ei.value)
    with pytest.raises(T.CoreError) as ei:
        T.reader_script(b"\x00\x01", ["u8", "done"])
    assert "trailing" in str(ei.value)
    with pytest.raises(T.CoreError):  # a list claiming 2**20 items in 8 bytes
        T.reader_script(struct.pack("<I", 2**20) + b"\x00" * 8, ["i64s"])
    with pytest.raises(T.CoreError) as ei:  # a status with an unknown code
        T.reader_script(bytes([200]) + b"\x00" * 12, ["status"])
    assert "status code" in str(ei.value)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64), st.lists(st.sampled_from(sorted(FIELDS) + ["str:4", "bytes:3", "i64s:2", "done"]),
                                        max_size=10))
def test_fuzz_reader_random_bytes(data, ops):
    try:
        out = T.reader_script(data, ops)
    except T.CoreError as e:
        assert e.code == PROTOCOL
        assert "malformed test message" in str(e)
    else:
        assert len(out) == len([o for o in ops if o != "done"])
