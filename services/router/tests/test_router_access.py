"""Who gets into a router, without a network: the mesh secret, user logins against scrypt hashes
(and what a new generation does to a remembered login), the users in the configuration, and the
start-up options that do not combine."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from enmasse.amqp.logins import UserLogins
from enmasse.common.passwords import hash_password
from enmasse.router.access import MeshSecret, MeshSecretError, world_readable
from enmasse.router.config import ConfigError, RouterConfig, config_from_proto, config_to_proto
from enmasse.router.main import main
from enmasse.v1 import router_pb2

ALICE = hash_password("wonderland")


def test_mesh_secret_admits_router_ids_with_the_secret(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("s3cret-value\n")
    path.chmod(0o600)
    secret = MeshSecret.read(path)
    assert secret.admits("r1", "s3cret-value")
    assert not secret.admits("r1", "s3cret-valu")
    assert not secret.admits("r1", "")
    assert not secret.admits("a/b", "s3cret-value"), "not a router id"
    assert not secret.admits("", "s3cret-value")
    assert "s3cret" not in repr(secret)
    assert not world_readable(path)
    path.chmod(0o640)
    assert not world_readable(path), "group-readable: a Kubernetes Secret mount"
    path.chmod(0o644)
    assert world_readable(path)


def test_an_unusable_mesh_secret_file_is_named(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text(" \n")
    with pytest.raises(MeshSecretError) as blank:
        MeshSecret.read(empty)
    assert str(blank.value) == f"mesh secret file {empty} is empty"
    with pytest.raises(MeshSecretError) as missing:
        MeshSecret.read(tmp_path / "missing")
    assert str(missing.value).startswith(f"cannot read mesh secret file {tmp_path / 'missing'}: ")


def test_user_logins_follow_the_running_users() -> None:
    users = {"alice": ALICE}
    logins = UserLogins(lambda: RouterConfig(users=users)).check
    assert logins("alice", "wonderland")
    assert logins("alice", "wonderland"), "remembered: the same answer"
    assert not logins("alice", "wonder")
    assert not logins("bob", "wonderland")
    users["alice"] = hash_password("looking-glass")  # a new generation: password changed
    assert not logins("alice", "wonderland")
    assert logins("alice", "looking-glass")
    del users["alice"]
    assert not logins("alice", "looking-glass")


def test_users_in_the_configuration() -> None:
    pushed = router_pb2.RouterConfig(
        generation=1,
        users=[
            router_pb2.RouterUser(username="alice", password_hash=ALICE),
            router_pb2.RouterUser(username="bob", password_hash=hash_password("x")),
        ],
    )
    config = config_from_proto(pushed, router_id="r1")
    assert config.users == {"alice": ALICE, "bob": pushed.users[1].password_hash}
    echoed = config_to_proto(config)
    assert [(u.username, u.password_hash) for u in echoed.users] == [("alice", ""), ("bob", "")]


@pytest.mark.parametrize(
    ("users", "error"),
    [
        ([("", ALICE)], "a user has an empty username"),
        ([("alice", ALICE), ("alice", ALICE)], "user 'alice' is listed twice"),
        (
            [("alice", "wonderland")],
            "user 'alice' has no usable password hash (expected scrypt$<n>$<r>$<p>$<salt>$<hash>)",
        ),
        ([("alice", "md5$1$1$1$c2FsdA==$aGFzaA==")], "user 'alice' has no usable password hash"),
    ],
)
def test_bad_users_are_refused_by_name(users: list[tuple[str, str]], error: str) -> None:
    pushed = router_pb2.RouterConfig(
        generation=1,
        users=[router_pb2.RouterUser(username=u, password_hash=h) for u, h in users],
    )
    with pytest.raises(ConfigError) as refused:
        config_from_proto(pushed, router_id="r1")
    assert str(refused.value).startswith(error)


def test_start_up_options_that_do_not_combine(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    runner = CliRunner()
    half_tls = runner.invoke(main, ["--router-id=r1", f"--tls-cert={cert}"])
    assert half_tls.exit_code == 2
    assert "--tls-cert and --tls-key go together" in half_tls.output
    empty = tmp_path / "secret"
    empty.write_text("")
    no_secret = runner.invoke(main, ["--router-id=r1", f"--mesh-secret-file={empty}"])
    assert no_secret.exit_code == 2
    assert f"mesh secret file {empty} is empty" in no_secret.output
