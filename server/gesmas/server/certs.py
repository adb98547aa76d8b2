"""A throw-away certificate authority for loopback TLS.

`gesmas up --tls` and the tests make a fresh CA, a server certificate and client
certificates with this module so that the local demo and the tests can run TLS and mutual
TLS (client certificates, the client's common name as its user name) on loopback. The CA
key sits unencrypted next to the certificates and everything expires in days: this is not a
PKI. For production use your own PKI and hand gesmas its PEM files.

Keys are EC P-256 (fast to make), files are PEM, private keys unencrypted with mode 0o600.
`make_pki` makes the whole set; `make_ca` and `issue` are its building blocks, for a second,
unrelated CA or a certificate from the wrong one.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass, field
from typing import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Pki", "make_pki", "make_ca", "issue", "read"]

_BACKDATE = datetime.timedelta(minutes=5)     # tolerate clocks a little behind ours


@dataclass(frozen=True)
class Pki:
    """Paths of the files `make_pki` wrote."""
    ca_cert: str
    ca_key: str
    server_cert: str
    server_key: str
    clients: dict[str, tuple[str, str]] = field(default_factory=dict)   # user -> (cert, key)


def read(path: str) -> bytes:
    """The bytes of a file (a PEM certificate or key), e.g. for gRPC credentials."""
    with open(path, "rb") as f:
        return f.read()


def make_pki(directory: str, users: Sequence[str] = ("root",),
             hosts: Sequence[str] = ("127.0.0.1", "localhost", "::1"), days: int = 7) -> Pki:
    """Write a CA, a server certificate for `hosts` and a client certificate per user into
    `directory` (created with mode 0o700), all valid for `days`."""
    ca_cert, ca_key = make_ca(directory, days=days)
    server_cert = os.path.join(directory, "server.pem")
    server_key = os.path.join(directory, "server.key")
    issue(ca_cert, ca_key, server_cert, server_key, "gesmas server", hosts=hosts, days=days)
    clients: dict[str, tuple[str, str]] = {}
    for user in users:
        cert = os.path.join(directory, f"client-{user}.pem")
        key = os.path.join(directory, f"client-{user}.key")
        issue(ca_cert, ca_key, cert, key, user, client=True, days=days)
        clients[user] = (cert, key)
    return Pki(ca_cert, ca_key, server_cert, server_key, clients)


def make_ca(directory: str, name: str = "gesmas throw-away CA", days: int = 7) -> tuple[str, str]:
    """Write a self-signed CA certificate and its key into `directory` (created with mode
    0o700 if missing) as ca.pem and ca.key; return their paths."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    not_before, not_after = _validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path = os.path.join(directory, "ca.pem")
    key_path = os.path.join(directory, "ca.key")
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return cert_path, key_path


def issue(ca_cert_path: str, ca_key_path: str, out_cert: str, out_key: str, common_name: str,
          *, hosts: Sequence[str] = (), client: bool = False, days: int = 7) -> None:
    """Write a fresh key and a certificate for it signed by the CA: subject CN=`common_name`,
    a subjectAltName per host (IP literals as IPAddress, others as DNSName), and extended key
    usage clientAuth if `client` else serverAuth."""
    ca_cert = x509.load_pem_x509_certificate(read(ca_cert_path))
    ca_key = serialization.load_pem_private_key(read(ca_key_path), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca_key_path}: not an EC private key")
    key = ec.generate_private_key(ec.SECP256R1())
    not_before, not_after = _validity(days)
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(h) for h in hosts]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_key(out_key, key)
    _write_cert(out_cert, cert)


def _validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now - _BACKDATE, now + datetime.timedelta(days=days)


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign,
        crl_sign=cert_sign, encipher_only=False, decipher_only=False)


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write_key(path: str, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    # Created 0o600 from the start (no window with wider permissions); chmod in case the
    # file already existed with another mode.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(pem)


def _write_cert(path: str, cert: x509.Certificate) -> None:
    with open(path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
