"""TLS and credentials of a client: how a channel is secured, and the token a call carries.

``TLS`` names the PEM files: the CA that signed the replicas' certificates (None: the
system's roots) and, for mutual TLS, the client's certificate and key. ``resolve_tls`` reads
the ``tls=`` argument of ``Client`` or, when it is None, the environment (``GESMAS_TLS_CA``,
``GESMAS_TLS_CERT``, ``GESMAS_TLS_KEY``; any of them set means TLS).

``Login`` holds a user name and password (``user=``/``password=``, else ``GESMAS_USER`` /
``GESMAS_PASSWORD``) or a ready token, and gives the metadata of a call:
``authorization: Bearer <token>``. It logs in (the Authenticate RPC) on first use, again a
minute before the token expires, and again when a replica refuses the token (revoked,
expired, issued before a password change). Shared by every thread of a client.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

__all__ = ["TLS", "Login", "resolve_tls"]

REFRESH_BEFORE = 60.0      # seconds before expiry at which a token is renewed


@dataclass(frozen=True)
class TLS:
    ca: str | None = None          # CA of the replicas' certificates (None: system roots)
    cert: str | None = None        # client certificate, for mutual TLS
    key: str | None = None         # its private key

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()
        if bool(self.cert) != bool(self.key):
            raise ValueError("TLS: a client certificate needs its key (cert= and key=)")
        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))


def resolve_tls(tls: Any, environ: Mapping[str, str] = os.environ) -> TLS | None:
    """The TLS settings for ``Client(tls=...)``: a ``TLS``; True (the environment's, else
    the system roots); False (plain text); a CA file path; a dict of TLS fields; None (the
    environment's if any variable is set, else plain text)."""
    if isinstance(tls, TLS):
        return tls
    if tls is False:
        return None
    if isinstance(tls, str):
        return TLS(ca=tls)
    if isinstance(tls, dict):
        return TLS(**tls)
    env = TLS(ca=environ.get("GESMAS_TLS_CA") or None,
              cert=environ.get("GESMAS_TLS_CERT") or None,
              key=environ.get("GESMAS_TLS_KEY") or None)
    if tls is True:
        return env
    if tls is None:
        return env if (env.ca or env.cert or env.key) else None
    raise TypeError(f"tls must be a TLS, bool, str, dict or None, not {type(tls).__name__}")


class Login:
    """A user's token, obtained and renewed by ``authenticate(user, password) -> (token,
    ttl)`` (the client's Authenticate RPC)."""

    def __init__(self, user: str | None, password: str | None, token: str | None,
                 environ: Mapping[str, str] = os.environ) -> None:
        if user is None and password is None and token is None:
            user, password = environ.get("GESMAS_USER"), environ.get("GESMAS_PASSWORD")
        if (user is None) != (password is None):
            raise ValueError("user= and password= go together")
        self.user, self._password = user, password
        self._token, self._expiry = token, float("inf")
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._token is not None or self.user is not None

    def can_renew(self) -> bool:
        return self._password is not None

    def due(self) -> bool:
        """Whether a login is needed before the next call (no token, or one about to end)."""
        return self._password is not None and (
            self._token is None or time.monotonic() > self._expiry - REFRESH_BEFORE)

    def credentials(self) -> tuple[str, str]:
        assert self.user is not None and self._password is not None
        return self.user, self._password

    def store(self, token: str, ttl: float) -> None:
        self._token, self._expiry = token, time.monotonic() + ttl

    def header(self) -> tuple[tuple[str, str], ...]:
        current = self._token
        return (("authorization", f"Bearer {current}"),) if current else ()

    def metadata(self, authenticate: Callable[[str, str], tuple[str, float]]
                 ) -> tuple[tuple[str, str], ...]:
        """The metadata of a call, logging in first if due (``authenticate`` is the
        synchronous client's Authenticate RPC; the asyncio client awaits its own)."""
        with self._lock:
            if self.due():
                self.store(*authenticate(*self.credentials()))
            return self.header()

    def refused(self, token_metadata: tuple[tuple[str, str], ...]) -> bool:
        """A replica refused the token sent as ``token_metadata``: forget it so that the next
        call logs in again. True if logging in again may help."""
        with self._lock:
            if self._password is None:
                return False
            if token_metadata and token_metadata[0][1] == f"Bearer {self._token}":
                self._token = None
            return True
