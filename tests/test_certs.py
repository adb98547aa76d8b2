"""gesmas.server.certs: the throw-away PKI makes certificates that Python's own TLS stack
accepts for mutual TLS on loopback, and rejects when they come from another CA."""
from __future__ import annotations

import os
import socket
import ssl
import stat
import threading
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gesmas.server import certs

TIMEOUT = 5.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> certs.Pki:
    return certs.make_pki(str(tmp_path_factory.mktemp("certs") / "pki"), users=("root", "alice"))


@pytest.fixture(scope="module")
def rogue(tmp_path_factory) -> dict[str, str]:
    """A second, unrelated CA and a client certificate for "alice" signed by it."""
    d = str(tmp_path_factory.mktemp("rogue"))
    ca_cert, ca_key = certs.make_ca(d, name="some other CA")
    cert, key = os.path.join(d, "alice.pem"), os.path.join(d, "alice.key")
    certs.issue(ca_cert, ca_key, cert, key, "alice", client=True)
    return {"ca_cert": ca_cert, "cert": cert, "key": key}


def server_context(pki: certs.Pki) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    ctx.load_verify_locations(cafile=pki.ca_cert)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(cafile: str, cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)      # check_hostname and CERT_REQUIRED
    ctx.load_verify_locations(cafile=cafile)
    ctx.load_cert_chain(cert, key)
    return ctx


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext,
              server_hostname: str = "127.0.0.1") -> tuple[Any, Any]:
    """One TLS connection on 127.0.0.1. The server sends the common name of the client's
    certificate and closes. Returns (server outcome, client outcome): the CN it saw or the
    exception, and the bytes the client read or the exception."""
    outcome: dict[str, Any] = {}
    done = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(TIMEOUT)

        def serve() -> None:
            try:
                conn, _ = listener.accept()
                conn.settimeout(TIMEOUT)
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    peer: Any = tls.getpeercert()
                    subject = dict(rdn[0] for rdn in peer["subject"])
                    outcome["server"] = subject["commonName"]
                    tls.sendall(subject["commonName"].encode())
            except (ssl.SSLError, OSError) as e:
                outcome["server"] = e
            finally:
                done.set()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with socket.create_connection(listener.getsockname()[:2], timeout=TIMEOUT) as raw:
                with client_ctx.wrap_socket(raw, server_hostname=server_hostname) as tls:
                    data = b""
                    while chunk := tls.recv(256):
                        data += chunk
                    outcome["client"] = data
        except (ssl.SSLError, OSError) as e:
            outcome["client"] = e
        assert done.wait(TIMEOUT), "server thread stuck"
        thread.join(TIMEOUT)
    return outcome["server"], outcome["client"]


@pytest.mark.parametrize("user", ["root", "alice"])
@pytest.mark.parametrize("server_hostname", ["127.0.0.1", "localhost"])
def test_mutual_tls_handshake_and_client_cn(pki, user, server_hostname):
    cert, key = pki.clients[user]
    server, client = handshake(server_context(pki), client_context(pki.ca_cert, cert, key),
                               server_hostname)
    assert server == user
    assert client == user.encode()


def test_client_cert_from_another_ca_is_refused(pki, rogue):
    server, client = handshake(server_context(pki),
                               client_context(pki.ca_cert, rogue["cert"], rogue["key"]))
    assert isinstance(server, ssl.SSLError), server
    # TLS 1.3: the client may finish its side of the handshake before the server's alert;
    # either way it never reads the common name.
    assert isinstance(client, (ssl.SSLError, OSError)) or client == b"", client


def test_client_trusting_another_ca_refuses_the_server(pki, rogue):
    cert, key = pki.clients["root"]
    server, client = handshake(server_context(pki),
                               client_context(rogue["ca_cert"], cert, key))
    assert isinstance(client, ssl.SSLCertVerificationError), client
    assert isinstance(server, (ssl.SSLError, OSError)), server


def test_server_name_not_in_certificate_is_refused(pki):
    cert, key = pki.clients["root"]
    _, client = handshake(server_context(pki), client_context(pki.ca_cert, cert, key),
                          server_hostname="elsewhere.example")
    assert isinstance(client, ssl.SSLCertVerificationError), client


def test_file_modes(pki):
    keys = [pki.ca_key, pki.server_key] + [k for _, k in pki.clients.values()]
    for path in keys:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    assert stat.S_IMODE(os.stat(os.path.dirname(pki.ca_cert)).st_mode) == 0o700


def test_certificate_contents(pki):
    def load(path):
        return x509.load_pem_x509_certificate(certs.read(path))

    ca, server = load(pki.ca_cert), load(pki.server_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    for user, (path, _) in pki.clients.items():
        cert = load(path)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == user
        assert cert.issuer == ca.subject
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        assert cert.serial_number != server.serial_number
