"""The local certificate authority and the certificates every EnMasse-py process presents.

In: a directory (`var/tls/` under `enmasse up`) and who needs a certificate: a `Holder` names the
process (the subject's common name), its role (the subject's organizational unit: `control-plane`,
`data-plane`, `broker`, `store`, `operator`, `endpoint`), the host names and addresses it serves
on, and whether it is a server, a client or both. Out: PEM files in the layout cert-manager
gives a Kubernetes Secret (`tls.crt`, `tls.key`, `ca.crt` in one directory per holder), so a
process reads the same `--tls-dir` locally and in a cluster.

Why it is idempotent: `enmasse up` runs again and again over the same `var/`. A CA that exists
and is valid for a while yet is kept (every certificate already issued stays trusted); a holder's
certificate is kept while the CA signed it, it names what is asked for and it does not expire
soon; anything else is issued anew. Keys are written with mode 0600 into a 0700 directory,
atomically (a reader never sees half a key, nobody else ever reads one).

Why EC P-256: small keys, fast handshakes, understood by OpenSSL, grpc's BoringSSL and etcd's Go.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_KEY_FILE = "ca.key"

CONTROL_PLANE = "control-plane"
"""The role (organizational unit) RouterAdmin and BrokerAdmin accept a caller in."""
DATA_PLANE = "data-plane"
"""Routers: they serve clients and call no control-plane API."""
BROKER = "broker"
"""Brokers: data plane too, and a draining broker calls its target's PrepareDrain."""
STORE = "store"
"""etcd: its own CA, so only the config service's certificate opens it."""
OPERATOR = "operator"
"""The machine operator (`enmasse status`, `up`'s readiness wait, the console): RouterAdmin and
BrokerAdmin let it read what a router runs and a broker holds, never change either; RouterAdmin
also lets it close a client's connection (the console's Close)."""
ENDPOINT = "endpoint"
"""A space's client endpoint (a router's, or a brokered space's broker's, amqps port): a server
certificate naming that one process, which clients verify; no port takes it from a client."""

CA_LIFETIME = datetime.timedelta(days=3650)
LEAF_LIFETIME = datetime.timedelta(days=825)
RENEW_BEFORE = datetime.timedelta(days=30)
LOOPBACK_NAMES = ("localhost",)
LOOPBACK_ADDRESSES = ("127.0.0.1",)


@dataclass(frozen=True)
class Holder:
    """Who a certificate is for: subject CN=`name`, OU=`role`, and where it is reached."""

    name: str
    role: str
    dns_names: Sequence[str] = LOOPBACK_NAMES
    ip_addresses: Sequence[str] = LOOPBACK_ADDRESSES
    server: bool = True
    client: bool = True


@dataclass(frozen=True)
class TlsFiles:
    """One holder's directory: its certificate, its key and the CA that vouches for its peers."""

    directory: Path
    cert: Path = field(init=False)
    key: Path = field(init=False)
    ca: Path = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cert", self.directory / CERT_FILE)
        object.__setattr__(self, "key", self.directory / KEY_FILE)
        object.__setattr__(self, "ca", self.directory / CA_FILE)

    def exist(self) -> bool:
        return self.cert.is_file() and self.key.is_file() and self.ca.is_file()

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(certificate chain, private key, CA bundle) as PEM bytes."""
        return self.cert.read_bytes(), self.key.read_bytes(), self.ca.read_bytes()


@dataclass(frozen=True)
class Authority:
    """A CA: its certificate and key, loaded."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write(path: Path, data: bytes, *, mode: int) -> None:
    """Writes `data` to `path` atomically, created with `mode` (never readable by others first)."""
    partial = path.with_name(path.name + ".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    os.chmod(partial, mode)
    os.replace(partial, path)


def _private_directory(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _lasts(certificate: x509.Certificate, *, margin: datetime.timedelta) -> bool:
    return certificate.not_valid_after_utc - margin > _now()


def _load_authority(directory: Path) -> Authority | None:
    try:
        certificate = x509.load_pem_x509_certificate((directory / CA_FILE).read_bytes())
        key = serialization.load_pem_private_key(
            (directory / CA_KEY_FILE).read_bytes(), password=None
        )
    except (OSError, ValueError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return None
    if key.public_key().public_numbers() != certificate.public_key().public_numbers():  # type: ignore[union-attr]
        return None
    return Authority(certificate=certificate, key=key)


def ensure_authority(directory: str | os.PathLike[str], *, name: str) -> Authority:
    """The CA kept in `directory` (`ca.crt`, `ca.key`): reused while it lasts, else made anew."""
    where = _private_directory(Path(directory))
    existing = _load_authority(where)
    if existing is not None and _lasts(existing.certificate, margin=LEAF_LIFETIME):
        return existing
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    authority = Authority(certificate=certificate, key=key)
    _write(where / CA_KEY_FILE, _key_pem(key), mode=0o600)
    _write(where / CA_FILE, authority.pem, mode=0o644)
    return authority


def _subject(holder: Holder) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, holder.role),
            x509.NameAttribute(NameOID.COMMON_NAME, holder.name),
        ]
    )


def _alternative_names(holder: Holder) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in holder.dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(address)) for address in holder.ip_addresses]
    return names


def _usages(holder: Holder) -> list[x509.ObjectIdentifier]:
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if holder.server else []
    return usages + ([ExtendedKeyUsageOID.CLIENT_AUTH] if holder.client else [])


def _still_fits(files: TlsFiles, holder: Holder, authority: Authority) -> bool:
    """Whether the certificate in `files` is the CA's, for `holder` as asked, and lasts a while."""
    try:
        certificate = x509.load_pem_x509_certificate(files.cert.read_bytes())
        if files.ca.read_bytes() != authority.pem or not files.key.is_file():
            return False
        certificate.verify_directly_issued_by(authority.certificate)
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    except (OSError, ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
        return False
    return (
        certificate.subject == _subject(holder)
        and set(names.value) == set(_alternative_names(holder))
        and list(usages.value) == _usages(holder)
        and _lasts(certificate, margin=RENEW_BEFORE)
    )


def issue(authority: Authority, holder: Holder) -> tuple[bytes, bytes]:
    """A new certificate for `holder` signed by `authority`: (certificate PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(_subject(holder))
        .issuer_name(authority.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + LEAF_LIFETIME, authority.certificate.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(_usages(holder)), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()),
            critical=False,
        )
    )
    if names := _alternative_names(holder):
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    certificate = builder.sign(authority.key, hashes.SHA256())
    return certificate.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def ensure_certificate(
    directory: str | os.PathLike[str], holder: Holder, *, authority: Authority
) -> TlsFiles:
    """`holder`'s tls.crt, tls.key and ca.crt in `directory`: kept while they fit, else issued."""
    files = TlsFiles(_private_directory(Path(directory)))
    if _still_fits(files, holder, authority):
        return files
    certificate, key = issue(authority, holder)
    _write(files.key, key, mode=0o600)
    _write(files.cert, certificate, mode=0o644)
    _write(files.ca, authority.pem, mode=0o644)
    return files


def roles_of(certificate_pem: bytes) -> tuple[str, ...]:
    """The organizational units a PEM certificate's subject names (its roles)."""
    subject = x509.load_pem_x509_certificate(certificate_pem).subject
    units = subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    return tuple(str(unit.value) for unit in units)


TLS_DIR_ENV = "ENMASSE_TLS_DIR"
"""Where a service finds its tls.crt/tls.key/ca.crt when no --tls-dir is given."""


def tls_dir_files(option: str | os.PathLike[str] | None) -> TlsFiles | None:
    """The TLS files a service was given (--tls-dir, else $ENMASSE_TLS_DIR), or None (plaintext).

    A directory that lacks one of the three files is an error: a half-configured TLS must not
    fall back to plaintext quietly."""
    where = option or os.environ.get(TLS_DIR_ENV)
    if not where:
        return None
    files = TlsFiles(Path(where))
    if not files.exist():
        raise FileNotFoundError(f"{where} must hold {CERT_FILE}, {KEY_FILE} and {CA_FILE}")
    return files


def add_tls_dir_argument(parser: argparse.ArgumentParser) -> None:
    """--tls-dir, the same for every service that parses its arguments with argparse."""
    parser.add_argument(
        "--tls-dir",
        default=None,
        help=f"mutual TLS for gRPC: {CERT_FILE}, {KEY_FILE}, {CA_FILE} "
        f"(else ${TLS_DIR_ENV}; none: plaintext, with a warning)",
    )
