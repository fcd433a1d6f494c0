"""`enmasse token create | list | revoke`, and which token a command calls with, against a real
`enmasse-config --bootstrap-token-file` over a real etcd (issue #15, item 4)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from enmasse.cli.main import cli
from enmasse.cli.tokens import ROLES, parse_duration
from enmasse.config.access import TOKEN_ROLES

from tests.fixtures.config_service import ConfigProcess
from tests.fixtures.etcd import EtcdProcess

ADMIN = "admin-token-of-the-cli-test-0123456789abcdef"


@pytest.fixture
def secured(
    etcd: EtcdProcess,
    etcd_prefix: str,
    config_process_factory: Callable[..., ConfigProcess],
    tmp_path: Path,
) -> tuple[str, Path]:
    """(the config service's address, a var dir whose run/admin-token is its admin token)."""
    var = tmp_path / "var"
    (var / "run").mkdir(parents=True)
    (var / "run" / "admin-token").write_text(ADMIN + "\n")
    config = config_process_factory(
        etcd_endpoint=etcd.endpoint,
        prefix=etcd_prefix,
        extra_args=[f"--bootstrap-token-file={var / 'run' / 'admin-token'}"],
    )
    return config.target, var


def enmasse(
    server: str, var: Path, *args: str, env_token: str | None = None
) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        cli,
        ["--server", server, "--var-dir", str(var), *args],
        env={"ENMASSE_TOKEN": env_token},  # None: unset
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def spaces(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines()[1:]]


def test_create_list_revoke(secured: tuple[str, Path], tmp_path: Path) -> None:
    server, var = secured
    code, out, err = enmasse(server, var, "token", "create", "viewer-a", "--role", "viewer",
                             "--space", "a", "--expires", "24h")  # fmt: skip
    assert code == 0, err
    secret = out.strip()
    assert len(out.splitlines()) == 1
    assert len(secret) >= 43
    assert err == "token viewer-a (viewer of a) created; it is shown only this once:\n"

    code, out, _ = enmasse(server, var, "token", "list")
    assert code == 0
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["NAME", "ROLE", "SPACES", "EXPIRES", "STATE", "CREATED-BY"]
    assert [(r[0], r[1], r[2], r[4], r[5]) for r in rows[1:]] == [
        ("admin", "admin", "*", "active", "bootstrap"),
        ("viewer-a", "viewer", "a", "active", "admin"),
    ]
    assert rows[1][3] == "never"
    assert rows[2][3].startswith("20")  # an ISO date a day away
    assert secret not in out
    assert ADMIN not in out

    code, out, err = enmasse(server, var, "token", "create", "viewer-a", "--role", "viewer",
                             "--space", "a")  # fmt: skip
    assert (code, err) == (
        1,
        "error: token 'viewer-a' already exists (revoke it, or create it with replace)\n",
    )
    code, out, err = enmasse(server, var, "token", "create", "x", "--role", "viewer")
    assert (code, err) == (1, "error: spaces: a viewer token needs at least one address space\n")

    code, out, _ = enmasse(server, var, "token", "revoke", "viewer-a")
    assert (code, out) == (0, "token viewer-a (viewer of a) revoked\n")
    code, _, err = enmasse(server, var, "--token", secret, "get", "addressspaces")
    assert code == 1
    assert err.startswith("error: token 'viewer-a' has been revoked (give --token TOKEN")
    code, out, _ = enmasse(server, var, "token", "list")
    assert "revoked" in out


def test_the_token_comes_from_the_option_else_the_env_else_the_var_dir(
    secured: tuple[str, Path], tmp_path: Path
) -> None:
    server, var = secured
    for space in ("a", "b"):
        manifest = tmp_path / f"{space}.yaml"
        manifest.write_text(
            "apiVersion: enmasse.io/v1\nkind: AddressSpace\n"
            f"metadata: {{name: {space}}}\nspec: {{type: standard, plan: standard-small}}\n"
        )
        assert enmasse(server, var, "apply", "-f", str(manifest))[0] == 0
    _, viewer, _ = enmasse(server, var, "token", "create", "viewer-a", "--role", "viewer",
                           "--space", "a")  # fmt: skip
    viewer = viewer.strip()

    # No option, no env: the admin token `enmasse up` keeps in the var dir sees every space.
    code, out, _ = enmasse(server, var, "get", "addressspaces")
    assert (code, spaces(out)) == (0, ["a", "b"])
    # $ENMASSE_TOKEN beats the var dir.
    code, out, _ = enmasse(server, var, "get", "addressspaces", env_token=viewer)
    assert (code, spaces(out)) == (0, ["a"])
    # --token beats $ENMASSE_TOKEN.
    code, out, _ = enmasse(server, var, "--token", ADMIN, "get", "addressspaces", env_token=viewer)
    assert (code, spaces(out)) == (0, ["a", "b"])

    # A refusal prints the server's message and exits 1; nothing changed.
    code, _, err = enmasse(server, var, "delete", "addressspace", "b", env_token=viewer)
    assert (code, err) == (
        1,
        "error: token 'viewer-a' (viewer of a) may not DeleteAddressSpace in address space 'b'\n",
    )
    code, out, _ = enmasse(server, var, "get", "addressspaces")
    assert spaces(out) == ["a", "b"]
    # The viewer's token is not an admin's: no tokens for it.
    code, _, err = enmasse(server, var, "token", "list", env_token=viewer)
    assert (code, err) == (1, "error: token 'viewer-a' (viewer of a) may not ListTokens\n")

    # No token anywhere: refused, with where a token comes from.
    empty = tmp_path / "empty-var"
    code, _, err = enmasse(server, empty, "get", "addressspaces")
    assert code == 1
    assert err == (
        "error: no credentials: call with the metadata 'authorization: Bearer <token>' "
        "(give --token TOKEN or set $ENMASSE_TOKEN; `enmasse up` keeps its admin token in "
        "<var-dir>/run/admin-token)\n"
    )


def test_durations_and_roles() -> None:
    assert [parse_duration(t) for t in ("90s", "15m", "24h", "7d", "3600")] == [
        90,
        900,
        86400,
        604800,
        3600,
    ]
    for bad in ("0h", "-1h", "1w", "h", ""):
        with pytest.raises(Exception, match="positive duration"):
            parse_duration(bad)
    assert ROLES == TOKEN_ROLES  # the CLI offers what the service takes
