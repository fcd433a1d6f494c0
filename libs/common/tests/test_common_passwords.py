"""Password hashes as the config service stores them and routers check them: salted, verified,
and a malformed stored string never matches and never raises."""

from __future__ import annotations

import pytest
from enmasse.common.passwords import hash_password, is_password_hash, verify_password


def test_a_hash_is_salted_and_verifies_only_its_password() -> None:
    first, second = hash_password("s3cret"), hash_password("s3cret")
    assert first != second
    assert first.startswith("scrypt$16384$8$1$")
    assert "s3cret" not in first
    assert verify_password("s3cret", first)
    assert verify_password("s3cret", second)
    assert not verify_password("s3cre", first)
    assert is_password_hash(first)


@pytest.mark.parametrize(
    "stored",
    [
        "",
        "s3cret",
        "md5$16384$8$1$c2FsdA==$aGFzaA==",
        "scrypt$x$8$1$c2FsdA==$aGFzaA==",
        "scrypt$16384$8$1$c2FsdA==$",
        "scrypt$16384$8$1$not base64!$aGFzaA==",
        "scrypt$0$8$1$c2FsdA==$aGFzaA==",
        "scrypt$3$8$1$c2FsdA==$aGFzaA==",
    ],
)
def test_a_malformed_stored_hash_never_matches(stored: str) -> None:
    assert not verify_password("s3cret", stored)
