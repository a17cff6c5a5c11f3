"""The egress proxy's per-sandbox certificate authority, for secrets added at egress.

A host whose policy entry carries secret headers is intercepted: the proxy
terminates the sandbox's TLS with a leaf certificate for that host, signed by a
CA that exists only in this process's memory and is trusted only by that one
sandbox (its bundle, :attr:`EgressCA.ca_pem`, goes into the sandbox; the key
never does). This module makes that CA and its leaves with ``cryptography``
(the optional extra ``corral[secrets]``; imported only when a policy has
secrets) and gives the proxy one server-side :class:`ssl.SSLContext` per host.

Keys: EC P-256, generated here, never written to a file system. Python's
``ssl`` loads a key only from a path, so each leaf's PEM is written to an
anonymous memory file (``memfd_create``: no name in any file system, closed
right after loading) and loaded from ``/proc/self/fd/N``. Validity: the CA 30
days (from one hour back, for clock skew), leaves at most 7 days and never past
the CA; a leaf is made again when it has less than a day left. Leaves are
cached per host (at most :data:`MAX_LEAVES`, the least recently used dropped).
"""

from __future__ import annotations

import collections
import datetime
import ipaddress
import os
import ssl
import threading
from collections.abc import Callable
from typing import Final

from corral.core.errors import ConfigInvalidError

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError as exc:
    raise ConfigInvalidError(
        "network.secrets", "secrets added at egress need the cryptography package: "
        f"pip install corral[secrets] ({exc})") from None

__all__ = ["CA_VALIDITY", "LEAF_VALIDITY", "MAX_LEAVES", "EgressCA"]

CA_VALIDITY: Final = datetime.timedelta(days=30)
LEAF_VALIDITY: Final = datetime.timedelta(days=7)
#: the most per-host server contexts kept
MAX_LEAVES: Final = 256
_SKEW: Final = datetime.timedelta(hours=1)
_RENEW: Final = datetime.timedelta(days=1)

#: ``on_sni_mismatch(host, port, sni)``: the proxy records a denial
SniMismatch = Callable[[str, int, str], None]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _load_chain(ctx: ssl.SSLContext, chain_pem: bytes, key_pem: bytes) -> None:
    """``ctx.load_cert_chain`` from memory: anonymous memory files, never a path on disk."""
    fds: list[int] = []
    try:
        for data, name in ((chain_pem, "corral-egress-chain"), (key_pem, "corral-egress-key")):
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            fds.append(fd)
            os.write(fd, data)
        ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
    finally:
        for fd in fds:
            os.close(fd)


class EgressCA:
    """One proxy's CA (EC P-256, in memory) and its cached per-host server contexts.

    ``on_sni_mismatch(host, port, sni)`` is called when a client's SNI names another host
    than the one whose leaf it is offered (the proxy records a denial)."""

    def __init__(self, on_sni_mismatch: SniMismatch | None = None) -> None:
        self._on_sni_mismatch = on_sni_mismatch
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        serial = x509.random_serial_number()
        name = x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "corral"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"corral egress CA {serial:x}"[:64]),
        ])
        ski = x509.SubjectKeyIdentifier.from_public_key(self._key.public_key())
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(serial)
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(self._key, hashes.SHA256())
        )
        #: the CA certificate, PEM: what the sandbox trusts (the key never leaves here)
        self.ca_pem: bytes = self._cert.public_bytes(serialization.Encoding.PEM)
        self._leaves: collections.OrderedDict[tuple[str, int],
                                              tuple[ssl.SSLContext, datetime.datetime]] \
            = collections.OrderedDict()
        self._lock = threading.Lock()

    @property
    def not_valid_after(self) -> datetime.datetime:
        return self._cert.not_valid_after_utc

    def __repr__(self) -> str:
        return f"EgressCA(subject={self._cert.subject.rfc4514_string()!r})"

    def leaf_pem(self, host: str) -> tuple[bytes, bytes, datetime.datetime]:
        """A new leaf for ``host`` (a normalized name or an IP address): (certificate chain
        PEM, private key PEM, not-valid-after)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        end = min(now + LEAF_VALIDITY, self._cert.not_valid_after_utc)
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        chain = cert.public_bytes(serialization.Encoding.PEM) + self.ca_pem
        key_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return chain, key_pem, end

    def server_context(self, host: str, port: int = 443) -> ssl.SSLContext:
        """The server-side context that presents ``host``'s leaf for a tunnel to ``port``
        (made, or taken from the cache). It speaks TLS 1.2+ and offers ALPN ``http/1.1``
        only (the proxy reads HTTP/1.1); a client whose SNI names another host gets an
        ``access_denied`` alert and the CA's ``on_sni_mismatch(host, port, sni)`` is
        called."""
        key = (host, port)
        with self._lock:
            hit = self._leaves.get(key)
            if hit is not None and hit[1] - _now() > _RENEW:
                self._leaves.move_to_end(key)
                return hit[0]
        chain, key_pem, end = self.leaf_pem(host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        _load_chain(ctx, chain, key_pem)
        del key_pem

        def check_sni(_obj: ssl.SSLObject, sni: str | None, _ctx: ssl.SSLContext) -> int | None:
            if sni is not None and sni.rstrip(".").lower() != host:
                if self._on_sni_mismatch is not None:
                    self._on_sni_mismatch(host, port, sni[:255])
                return ssl.ALERT_DESCRIPTION_ACCESS_DENIED
            return None

        ctx.sni_callback = check_sni
        with self._lock:
            self._leaves[key] = (ctx, end)
            self._leaves.move_to_end(key)
            while len(self._leaves) > MAX_LEAVES:
                self._leaves.popitem(last=False)
        return ctx
