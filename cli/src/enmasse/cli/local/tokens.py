"""The access tokens of a local installation: the admin's, and one per control-plane service.

In: the var dir and, once config answers, its address. Out: <var>/run/admin-token (made before
config first starts: config stores it as the admin token when its store holds none, so the
store is never open) and <var>/run/tokens/<service>.token for each service that calls config,
each with the least privilege it needs (`SERVICE_ROLES`), every file of mode 0600 in a 0700
directory. The services read their file on every call (`enmasse.common.credentials.TokenFile`),
so those started before their file exists get going as soon as it is there.

Idempotence: a token file that config still accepts is kept; one it refuses (a store started
afresh, a token revoked) is replaced by a new token of the same name. The runtime program has
no token: it never calls config. Every call goes over TLS verified against the CA certificate
`up` published (<var>/tls/ca.crt), with no client certificate: the token is the credential.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path

from enmasse.cli.client import CliError, ConfigClient, local_ca_file
from enmasse.cli.local.var_dir import VarDir
from enmasse.resources.kinds import KINDS

SERVICE_ROLES: Mapping[str, str] = {
    "router-agent": "controller",
    "storage-controller": "controller",
    "subscription": "subscription",
    "gitops": "gitops",  # `enmasse gitops sync` on this machine
}
"""Each control-plane service that calls config, and the role of its token (see
services/config/src/enmasse/config/access.py for what each role may do)."""


def write_secret(path: Path, secret: str) -> None:
    """Writes `secret` to `path`, mode 0600 from the first byte, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        path.parent.chmod(0o700)
    partial = path.with_name(path.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(secret + "\n")
    os.replace(partial, path)


def read_secret(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def ensure_admin_token(var: VarDir) -> None:
    """A fresh admin token in <var>/run/admin-token unless there is one: config's bootstrap."""
    if not read_secret(var.admin_token):
        write_secret(var.admin_token, secrets.token_urlsafe(32))


ACCEPT_TRIES = 3


def accepted(address: str, token: str, *, ca_file: Path | None) -> bool:
    """Whether config at `address` takes `token` (a read every role may make). A config service
    `up` has just (re)started may not answer the first call under load: a failed call is tried
    again, and the calls wait for the connection, before the token counts as refused."""
    with ConfigClient(
        server=address, timeout=10.0, token=token, ca_file=ca_file, wait_for_ready=True
    ) as client:
        for attempt in range(ACCEPT_TRIES):
            try:
                client.list(KINDS["AddressPlan"])
                return True
            except CliError:
                if attempt + 1 < ACCEPT_TRIES:
                    time.sleep(1.0)
    return False


def ensure_service_tokens(var: VarDir, *, address: str) -> list[str]:
    """Every service's token file, made (or remade) where config does not take the one there;
    returns the services whose token was made."""
    admin, ca_file = read_secret(var.admin_token), local_ca_file(var.root)
    if not accepted(address, admin, ca_file=ca_file):
        raise CliError(
            f"the config service at {address} does not accept the admin token in "
            f"{var.admin_token} (its store has another admin token): write that one into "
            "the file, or start from an empty var dir"
        )
    made = []
    with ConfigClient(server=address, token=admin, ca_file=ca_file) as client:
        for service, role in SERVICE_ROLES.items():
            path = var.service_token(service)
            current = read_secret(path)
            if current and accepted(address, current, ca_file=ca_file):
                continue
            reply = client.create_token(name=service, role=role, replace=True)
            write_secret(path, reply.secret)
            made.append(service)
    return made
