"""Password hashes as the config service stores them and routers check them: salted, verified,
and a malformed stored string never matches and never raises; SCRAM keys, salted afresh each
time, that let scramp's client in with their password and with no other."""

from __future__ import annotations

import pytest
import scramp
from enmasse.common.passwords import (
    SCRAM_MECHANISMS,
    ScramKeys,
    hash_password,
    is_password_hash,
    scram_keys,
    verify_password,
)


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


def _scram_round_trip(keys: ScramKeys, *, password: str) -> bool:
    """scramp's client with `password` against scramp's server holding `keys`: True if in."""
    server = scramp.ScramMechanism(keys.mechanism).make_server(
        lambda _user: (keys.salt, keys.stored_key, keys.server_key, keys.iterations)
    )
    client = scramp.ScramClient([keys.mechanism], "alice", password)
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    try:
        server.set_client_final(client.get_client_final())
    except scramp.ScramException:
        return False
    client.set_server_final(server.get_server_final())  # the server proved it holds the keys
    return True


@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_scram_keys_are_salted_and_let_only_their_password_in(mechanism: str) -> None:
    keys = scram_keys("s3cret", mechanism=mechanism)
    again = scram_keys("s3cret", mechanism=mechanism)
    assert (keys.mechanism, keys.iterations) == (mechanism, 4096)
    assert len(keys.salt) >= 16
    assert keys.salt != again.salt
    assert keys.stored_key != again.stored_key, "a fresh salt, other keys"
    assert b"s3cret" not in keys.stored_key + keys.server_key + keys.salt
    assert "s3cret" not in repr(keys)
    assert "stored_key" not in repr(keys)
    assert _scram_round_trip(keys, password="s3cret")
    assert _scram_round_trip(again, password="s3cret")
    assert not _scram_round_trip(keys, password="s3cre")


def test_scram_keys_refuse_unknown_mechanisms_and_few_iterations() -> None:
    with pytest.raises(ValueError, match="unknown SCRAM mechanism 'SCRAM-SHA-1'"):
        scram_keys("s3cret", mechanism="SCRAM-SHA-1")
    with pytest.raises(ValueError, match="must not be < 4096"):
        scram_keys("s3cret", mechanism="SCRAM-SHA-256", iterations=1000)
    assert scram_keys("s3cret", mechanism="SCRAM-SHA-256", iterations=8192).iterations == 8192
