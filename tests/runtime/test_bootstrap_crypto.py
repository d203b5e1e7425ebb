"""SHA-256, HMAC-SHA256, digest compare and randomness of the core, against hashlib/hmac."""
import hashlib
import hmac

from hypothesis import given, settings, strategies as st

from appliance.runtime import _core_testing as T


def test_sha256_known_vectors_and_block_boundaries():
    # FIPS 180-4 examples, then every length around the 55/56/64-byte padding edges.
    assert T.sha256(b"").hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert T.sha256(b"abc").hex() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    two_blocks = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
    assert T.sha256(two_blocks).hex() == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    for n in list(range(0, 130)) + [1000, 4095, 4096, 4097, 1 << 20]:
        data = bytes((i * 7 + n) & 0xFF for i in range(n))
        assert T.sha256(data) == hashlib.sha256(data).digest(), n


def test_hmac_rfc4231_and_key_lengths():
    # RFC 4231 test case 2 and 6 (key longer than a block).
    assert T.hmac_sha256(b"Jefe", b"what do ya want for nothing?").hex() == (
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
    key = b"\xaa" * 131
    msg = b"Test Using Larger Than Block-Size Key - Hash Key First"
    assert T.hmac_sha256(key, msg).hex() == "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
    for klen in (0, 1, 31, 32, 63, 64, 65, 128, 1000):
        for mlen in (0, 1, 55, 56, 64, 200):
            k, m = bytes((i * 13) & 0xFF for i in range(klen)), b"m" * mlen
            assert T.hmac_sha256(k, m) == hmac.new(k, m, "sha256").digest(), (klen, mlen)


@settings(max_examples=150, deadline=None)
@given(key=st.binary(max_size=300), msg=st.binary(max_size=3000))
def test_hmac_and_sha_match_python_on_random_inputs(key, msg):
    assert T.sha256(msg) == hashlib.sha256(msg).digest()
    assert T.hmac_sha256(key, msg) == hmac.new(key, msg, "sha256").digest()


def test_digest_equal_and_random_bytes():
    a = T.sha256(b"a")
    assert T.digest_equal(a, a)
    for i in range(32):  # a difference in any single byte is seen
        b = bytearray(a)
        b[i] ^= 0x01
        assert not T.digest_equal(a, bytes(b))
    assert len(T.random_bytes(0)) == 0
    draws = {T.random_bytes(32) for _ in range(64)}
    assert len(draws) == 64 and all(len(d) == 32 for d in draws)
    big = T.random_bytes(1 << 16)
    assert len(big) == 1 << 16 and len(set(big)) == 256  # every byte value shows up in 64 KiB
