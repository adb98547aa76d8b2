"""Passwords and tokens: the part of authentication that happens on the replica that takes a
call, outside the log (the kernel only ever sees the user name the gateway vouches for, and
salted password hashes).

- Passwords are hashed with scrypt (n=2^14, r=8, p=1, 16 random bytes of salt), as
  ``scrypt$n$r$p$salt-hex$hash-hex``; only the hash enters the log.
- A token is ``v1.<base64url payload>.<base64url HMAC-SHA256>`` over the payload
  ``{"u": user, "g": password generation, "r": record, "e": expiry (unix time)}``, keyed by a
  key derived from the cluster secret: any replica verifies a token any other issued, without
  state.
- A token is bound to the user record it was issued for: "r" is a keyed fingerprint of the
  record's stored password hash. That hash is salted afresh (16 random bytes, drawn by the
  gateway) by every user_add and user_passwd, so it names one record at one password: a
  password change, or deleting the user (whatever user is made later under the same name),
  revokes every token issued before, on every replica that has applied the change
  (`Tokens.revoked`). The replicated state needs no new field for it, so a state written by
  an earlier gesmas binds tokens the same way on every replica.
- "g" is read by replicas of the previous version only (they refuse a token whose generation
  is below the user's); a token without "r" (issued by one of them) is refused here: the
  client logs in again.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from typing import NamedTuple

_N, _R, _P = 1 << 14, 8, 1
TOKEN_TTL = 600.0                 # seconds, like etcd's simple tokens (5 min) order


class TokenError(ValueError):
    """The token is malformed, forged or expired; the message says which (for the caller)."""


class Claims(NamedTuple):
    """What a valid token says: its user and the fingerprint of that user's record."""
    user: str
    gen: int
    record: str


def hash_password(password: str) -> str:
    salt = os.urandom(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return f"scrypt${_N}${_R}${_P}${salt.hex()}${digest.hex()}"


def check_password(password: str, stored: str) -> bool:
    """Whether `password` matches the stored hash (False for a malformed or empty hash:
    a user made for client-certificate login has none)."""
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt" or int(n) > 1 << 20 or int(r) > 64 or int(p) > 16:
            return False
        got = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r),
                             p=int(p), dklen=len(digest) // 2)
    except (ValueError, MemoryError):
        return False
    return hmac.compare_digest(got.hex(), digest)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Tokens:
    """Issues and verifies tokens with a key derived from the cluster secret."""

    def __init__(self, cluster_secret: str, ttl: float = TOKEN_TTL) -> None:
        self._key = hashlib.pbkdf2_hmac("sha256", cluster_secret.encode(),
                                        b"gesmas auth token v1", 10_000)
        self.ttl = ttl

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def fingerprint(self, stored_hash: str) -> str:
        """The record fingerprint a token carries: keyed, so that the token shows nothing of
        the stored hash."""
        return _b64(hmac.new(self._key, b"record\0" + stored_hash.encode(),
                             hashlib.sha256).digest()[:16])

    def issue(self, user: str, gen: int, stored_hash: str, now: float | None = None) -> str:
        """A token for `user` bound to its record, whose stored password hash is
        `stored_hash` (as the log holds it) and generation `gen`."""
        now = time.time() if now is None else now
        payload = _b64(json.dumps({"u": user, "g": gen, "r": self.fingerprint(stored_hash),
                                   "e": round(now + self.ttl, 3)},
                                  separators=(",", ":")).encode())
        return f"v1.{payload}.{self._mac(payload)}"

    def verify(self, token: str, now: float | None = None) -> Claims:
        """The claims of a token issued by this cluster and not expired; TokenError
        otherwise. Whether its user record still exists is `revoked`'s question."""
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != "v1" or len(token) > 4096:
            raise TokenError("malformed token")
        if not hmac.compare_digest(self._mac(parts[1]), parts[2]):
            raise TokenError("invalid token (not issued by this cluster)")
        try:
            data = json.loads(_unb64(parts[1]))
            user, gen, expiry = data["u"], data["g"], data["e"]
            record = data.get("r")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise TokenError("malformed token") from None
        if (time.time() if now is None else now) > expiry:
            raise TokenError("token expired: authenticate again")
        if not isinstance(record, str):
            raise TokenError("token issued by an earlier gesmas (not bound to a user record): "
                             "authenticate again")
        return Claims(str(user), int(gen), record)

    def revoked(self, claims: Claims, stored_hash: str | None) -> str | None:
        """Why a token with these claims no longer stands for its user, whose stored password
        hash is now `stored_hash` (None: no such user); None if it still does."""
        if stored_hash is None:
            return (f"token revoked: user {claims.user!r} was deleted (its tokens stay "
                    "revoked, whatever user is made later under that name)")
        if not stored_hash or not hmac.compare_digest(self.fingerprint(stored_hash),
                                                      claims.record):
            return (f"token revoked: the password of {claims.user!r} changed, or the user "
                    "was deleted and made again since the token was issued: authenticate "
                    "again")
        return None
