"""The replica-to-replica encryption and framing (server/replication/raftwire.py)."""
from __future__ import annotations

import pickle

import pytest

from gesmas.server.replication.raftwire import (COMPRESS_FROM, HEADER_LEN, AeadEncryptor, Framing,
                                    derive_master)

SALT = b"0123456789abcdef"


@pytest.fixture(scope="module")
def master() -> bytes:
    return derive_master("cluster secret", SALT)


def test_two_runs_with_one_secret_read_each_other(master):
    a, b = AeadEncryptor(master), AeadEncryptor(master)
    for i, msg in enumerate([b"", b"x", pickle.dumps({"type": "append_entries", "n": 1})]):
        token = a.encrypt_at_time(msg, 100 + i)
        assert b.extract_timestamp(token) == 100 + i
        assert b.decrypt(token) == msg
        assert a.decrypt(b.encrypt_at_time(msg, 7)) == msg  # decrypt without extract first


def test_tokens_never_repeat_a_nonce_and_hide_the_plaintext(master):
    a = AeadEncryptor(master)
    t1, t2 = a.encrypt_at_time(b"same", 1), a.encrypt_at_time(b"same", 1)
    assert t1 != t2 and t1[HEADER_LEN:] != t2[HEADER_LEN:]
    assert b"same" not in t1
    assert AeadEncryptor(master).encrypt_at_time(b"same", 1)[1:17] != t1[1:17]  # run salt


@pytest.mark.parametrize("where", ["version", "salt", "timestamp", "counter", "body", "tag"])
def test_any_changed_byte_is_refused(master, where):
    a, b = AeadEncryptor(master), AeadEncryptor(master)
    token = bytearray(a.encrypt_at_time(b"payload bytes", 5))
    pos = {"version": 0, "salt": 3, "timestamp": 20, "counter": 30, "body": HEADER_LEN + 2,
           "tag": len(token) - 1}[where]
    token[pos] ^= 0x01
    with pytest.raises(Exception):
        b.extract_timestamp(bytes(token))
    with pytest.raises(Exception):
        b.decrypt(bytes(token))


def test_another_secret_or_a_short_token_is_refused(master):
    token = AeadEncryptor(derive_master("other secret", SALT)).encrypt_at_time(b"m", 1)
    with pytest.raises(Exception):
        AeadEncryptor(master).extract_timestamp(token)
    with pytest.raises(ValueError):
        AeadEncryptor(master).decrypt(b"\x47short")


def test_framing_round_trips_and_compresses_only_large_messages():
    small, large = b"a" * 100, bytes(range(256)) * (COMPRESS_FROM // 256 + 4)
    assert Framing.compress(small, 3) == b"r" + small
    packed = Framing.compress(large, 3)
    assert packed[:1] == b"z" and len(packed) < len(large)
    for data in (b"", small, large):
        assert Framing.decompress(Framing.compress(data)) == data
    with pytest.raises(ValueError):
        Framing.decompress(b"xjunk")
