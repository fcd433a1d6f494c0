"""The local CA and the holders' certificates: made once, kept while they fit, keys private."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from enmasse.common.certificates import (
    CONTROL_PLANE,
    Holder,
    ensure_authority,
    ensure_certificate,
    roles_of,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_authority_is_made_once_and_kept(tmp_path: Path) -> None:
    first = ensure_authority(tmp_path / "ca", name="test CA")
    again = ensure_authority(tmp_path / "ca", name="test CA")
    assert again.pem == first.pem
    assert _mode(tmp_path / "ca") == 0o700
    assert _mode(tmp_path / "ca" / "ca.key") == 0o600
    constraints = first.certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.value.ca


def test_certificate_names_holder_and_is_signed_by_the_authority(tmp_path: Path) -> None:
    authority = ensure_authority(tmp_path / "ca", name="test CA")
    holder = Holder(
        name="router-agent", role=CONTROL_PLANE, dns_names=("localhost", "agent.example")
    )
    files = ensure_certificate(tmp_path / "agent", holder, authority=authority)
    certificate = x509.load_pem_x509_certificate(files.cert.read_bytes())
    certificate.verify_directly_issued_by(authority.certificate)
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {"localhost", "agent.example"}
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert roles_of(files.cert.read_bytes()) == (CONTROL_PLANE,)
    assert files.ca.read_bytes() == authority.pem
    assert _mode(files.key) == 0o600
    assert _mode(files.directory) == 0o700


def test_certificate_is_kept_while_it_fits_and_reissued_when_not(tmp_path: Path) -> None:
    authority = ensure_authority(tmp_path / "ca", name="test CA")
    holder = Holder(name="config", role=CONTROL_PLANE)
    first = ensure_certificate(tmp_path / "config", holder, authority=authority).cert.read_bytes()
    kept = ensure_certificate(tmp_path / "config", holder, authority=authority).cert.read_bytes()
    assert kept == first
    client_only = Holder(name="config", role=CONTROL_PLANE, server=False)
    changed = ensure_certificate(tmp_path / "config", client_only, authority=authority)
    assert changed.cert.read_bytes() != first


def test_certificate_of_another_authority_is_replaced(tmp_path: Path) -> None:
    holder = Holder(name="broker", role="data-plane")
    other = ensure_authority(tmp_path / "other", name="other CA")
    ensure_certificate(tmp_path / "broker", holder, authority=other)
    ours = ensure_authority(tmp_path / "ca", name="test CA")
    files = ensure_certificate(tmp_path / "broker", holder, authority=ours)
    x509.load_pem_x509_certificate(files.cert.read_bytes()).verify_directly_issued_by(
        ours.certificate
    )
    assert files.ca.read_bytes() == ours.pem
