"""Passwords and tokens: the part of authentication that happens on the replica that takes a
call, outside the log (the kernel only ever sees the user name the gateway vouches for, and
salted password hashes).

- Passwords are hashed with scrypt (n=2^14, r=8, p=1, 16 random bytes of salt), as
  ``scrypt$n$r$p$salt-hex$hash-hex``; only the hash enters the log.
- A token is ``v1.<base64url payload>.<base64url HMAC-SHA256>`` over the payload
  ``{"u": user, "g": password generation, "e": expiry (unix time)}``, keyed by a key derived
  from the cluster secret: any replica verifies a token any other issued, without state. A
  password change bumps the user's generation, so older tokens stop working on every replica
  that has applied the change; a deleted user's token fails in the kernel (unknown user).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time

_N, _R, _P = 1 << 14, 8, 1
TOKEN_TTL = 600.0                 # seconds, like etcd's simple tokens (5 min) order


class TokenError(ValueError):
    """The token is malformed, forged or expired; the message says which (for the caller)."""


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

    def issue(self, user: str, gen: int, now: float | None = None) -> str:
        now = time.time() if now is None else now
        payload = _b64(json.dumps({"u": user, "g": gen, "e": round(now + self.ttl, 3)},
                                  separators=(",", ":")).encode())
        return f"v1.{payload}.{self._mac(payload)}"

    def verify(self, token: str, now: float | None = None) -> tuple[str, int]:
        """(user, generation) of a valid token; TokenError otherwise."""
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != "v1" or len(token) > 4096:
            raise TokenError("malformed token")
        if not hmac.compare_digest(self._mac(parts[1]), parts[2]):
            raise TokenError("invalid token (not issued by this cluster)")
        try:
            data = json.loads(_unb64(parts[1]))
            user, gen, expiry = data["u"], data["g"], data["e"]
        except (ValueError, KeyError, TypeError):
            raise TokenError("malformed token") from None
        if (time.time() if now is None else now) > expiry:
            raise TokenError("token expired: authenticate again")
        return str(user), int(gen)
