"""`enmasse token create | list | revoke`: the config service's access tokens, for its admin.

In: a name, a role (admin, tenant-admin, viewer, or a control-plane role), the address spaces a
tenant-admin or viewer covers, and how long the token lives (`--expires 24h`). Out: `create`
prints the new token once, on stdout alone (so `TOKEN=$(enmasse token create ...)` works), what
it is on stderr; the store keeps only its hash, so it cannot be shown again. `list` prints every
token's name, role, spaces, expiry and state, never a secret. `revoke` makes one unusable at once.

The calls need an admin token (`--token`, $ENMASSE_TOKEN, or `enmasse up`'s); a refusal prints
the server's message and exits 1, as every other command does.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Protocol

import click
from enmasse.cli.client import CliError, ConfigClient
from enmasse.cli.render import make_console, print_table
from enmasse.v1 import config_pb2

ROLES = ("admin", "tenant-admin", "viewer", "controller", "subscription", "gitops")
_DURATION = re.compile(r"^(\d+)([smhd]?)$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class _Settings(Protocol):
    def client(self) -> ConfigClient: ...


def parse_duration(text: str) -> int:
    """Seconds in `90s`, `15m`, `24h`, `7d` or a plain number of seconds."""
    match = _DURATION.match(text.strip())
    if match is None or int(match.group(1)) <= 0:
        raise CliError(f"--expires {text}: give a positive duration such as 90s, 15m, 24h or 7d")
    return int(match.group(1)) * _UNIT[match.group(2)]


def describe(token: config_pb2.Token) -> str:
    """`alice (tenant-admin of shop, lab)`."""
    scope = f" of {', '.join(token.spaces)}" if token.spaces else ""
    return f"{token.name} ({token.role}{scope})"


def state_of(token: config_pb2.Token, *, now: datetime) -> str:
    if token.revoked:
        return "revoked"
    if token.HasField("expires_at") and token.expires_at.ToDatetime(tzinfo=UTC) <= now:
        return "expired"
    return "active"


def token_row(token: config_pb2.Token, *, now: datetime) -> tuple[str, ...]:
    expires = (
        token.expires_at.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds")
        if token.HasField("expires_at")
        else "never"
    )
    return (
        token.name,
        token.role,
        ",".join(token.spaces) or "*",
        expires,
        state_of(token, now=now),
        token.created_by,
    )


@click.group()
def token() -> None:
    """Access tokens of the config service (an admin's verbs)."""


@token.command()
@click.argument("name")
@click.option("--role", type=click.Choice(ROLES), required=True, help="what it may do")
@click.option(
    "-s", "--space", "spaces", multiple=True, help="address space (tenant-admin, viewer; repeat)"
)
@click.option("--expires", metavar="DURATION", help="lifetime: 90s, 15m, 24h, 7d [never]")
@click.option("--replace", is_flag=True, help="replace a token of that name (its secret stops)")
@click.pass_obj
def create(
    settings: _Settings,
    name: str,
    role: str,
    spaces: tuple[str, ...],
    expires: str | None,
    replace: bool,
) -> None:
    """Create token NAME and print it, this once."""
    expires_in = parse_duration(expires) if expires else 0
    with settings.client() as client:
        reply = client.create_token(
            name=name, role=role, spaces=spaces, expires_in=expires_in, replace=replace
        )
    click.echo(f"token {describe(reply.token)} created; it is shown only this once:", err=True)
    click.echo(reply.secret)


@token.command(name="list")
@click.pass_obj
def list_tokens(settings: _Settings) -> None:
    """Every token: name, role, spaces, expiry, state. Never a secret."""
    with settings.client() as client:
        tokens = client.list_tokens()
    now = datetime.now(tz=UTC)
    print_table(
        make_console(),
        ("NAME", "ROLE", "SPACES", "EXPIRES", "STATE", "CREATED-BY"),
        [token_row(t, now=now) for t in tokens],
    )


@token.command()
@click.argument("name")
@click.pass_obj
def revoke(settings: _Settings, name: str) -> None:
    """Revoke token NAME: from now on it is refused."""
    with settings.client() as client:
        revoked = client.revoke_token(name)
    click.echo(f"token {describe(revoked)} revoked")
