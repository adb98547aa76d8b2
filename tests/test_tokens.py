"""Passwords and tokens (server/tokens.py), and the client's side of logging in."""
from __future__ import annotations

import json
import time

import pytest

from gesmas.client.security import TLS, Login, resolve_tls
from gesmas.server.tokens import TokenError, Tokens, _b64, check_password, hash_password


def test_password_hashes_are_salted_and_checked():
    h1, h2 = hash_password("correct horse"), hash_password("correct horse")
    assert h1 != h2 and h1.startswith("scrypt$")
    assert check_password("correct horse", h1) and check_password("correct horse", h2)
    assert not check_password("correct hors", h1)
    for bad in ("", "scrypt$1$2", "plain", "scrypt$99999999999$8$1$00$00",
                "bcrypt$16384$8$1$00$00"):
        assert not check_password("x", bad)


def test_a_token_names_its_user_and_record_until_it_expires():
    t = Tokens("cluster-secret", ttl=60)
    stored = hash_password("alice-password")
    token = t.issue("alice", 3, stored, now=1000.0)
    claims = t.verify(token, now=1059.0)
    assert (claims.user, claims.gen) == ("alice", 3)
    assert claims.record == t.fingerprint(stored) and stored not in token
    with pytest.raises(TokenError, match="expired"):
        t.verify(token, now=1061.0)
    assert Tokens("cluster-secret").verify(token, now=1000.0) == claims      # any replica


def test_a_token_of_an_earlier_gesmas_is_refused_with_a_reason():
    t = Tokens("cluster-secret")
    payload = _b64(json.dumps({"u": "alice", "g": 1, "e": time.time() + 60}).encode())
    with pytest.raises(TokenError, match="earlier gesmas.*authenticate again"):
        t.verify(f"v1.{payload}.{t._mac(payload)}")


def test_forged_tokens_are_refused():
    t = Tokens("cluster-secret")
    token = t.issue("alice", 1, "h")
    head, payload, mac = token.split(".")
    other = Tokens("another-secret").issue("root", 1, "h")
    # A MAC with its last two characters changed (to "AA", or "BB" when it ends in "AA").
    tampered = mac[:-2] + ("BB" if mac.endswith("AA") else "AA")
    for bad in ("", "v1", "v2." + payload + "." + mac, f"v1.{payload}.{tampered}",
                f"v1.{other.split('.')[1]}.{mac}", other, "v1.." , "x" * 5000):
        with pytest.raises(TokenError):
            t.verify(bad)


def test_the_client_logs_in_once_and_again_when_refused():
    calls = []

    def authenticate(user, password):
        calls.append((user, password))
        return f"token{len(calls)}", 600.0

    login = Login("alice", "pw", None, environ={})
    meta = login.metadata(authenticate)
    assert meta == (("authorization", "Bearer token1"),)
    assert login.metadata(authenticate) == meta and len(calls) == 1
    assert login.refused(meta)
    assert login.metadata(authenticate) == (("authorization", "Bearer token2"),)
    ready = Login(None, None, "given", environ={})
    assert ready.metadata(authenticate) == (("authorization", "Bearer given"),)
    assert not ready.refused(ready.metadata(authenticate))   # cannot renew a given token
    assert not Login(None, None, None, environ={}).enabled
    assert Login(None, None, None, environ={"GESMAS_USER": "u",
                                            "GESMAS_PASSWORD": "p"}).user == "u"
    with pytest.raises(ValueError):
        Login("alice", None, None, environ={})


def test_tls_settings_from_arguments_and_environment():
    assert resolve_tls(None, {}) is None and resolve_tls(False, {"GESMAS_TLS_CA": "x"}) is None
    assert resolve_tls(None, {"GESMAS_TLS_CA": "ca.pem"}) == TLS(ca="ca.pem")
    assert resolve_tls(True, {}) == TLS()
    assert resolve_tls("ca.pem", {}) == TLS(ca="ca.pem")
    assert resolve_tls({"ca": "a", "cert": "b", "key": "c"}, {}) == TLS("a", "b", "c")
    with pytest.raises(TypeError):
        resolve_tls(42, {})
    with pytest.raises(ValueError):
        TLS(cert="only-cert.pem").credentials()
