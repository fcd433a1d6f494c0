"""Who may connect to a router's inter-router port: the other routers of its space.

What flows in: the mesh secret (a file the runtime renders once per address space, read at
start-up). What flows out: `MeshSecret.admits`, the password check of the inter-router
listener's `sasl.Passwords` authenticator (`enmasse.amqp.sasl`). The client listener's
authenticator is `enmasse.amqp.logins.UserLogins` over the running configuration (its users and
the plan's login policy), the one a brokered space's broker uses too.

Why it is built so:
- a router logs in to a peer with SASL PLAIN, user = its router id, password = the space's
  secret; the secret is compared in constant time, and the listener offers no ANONYMOUS, so a
  stranger's connection ends in the SASL exchange with amqp:unauthorized-access, before it can
  open a link, advertise a route or count as a neighbour.
"""

from __future__ import annotations

import hmac
import stat
from dataclasses import dataclass, field
from pathlib import Path


class MeshSecretError(ValueError):
    """A mesh secret file that cannot be used; the message names the file and why."""


def is_router_id(name: str) -> bool:
    return bool(name) and "/" not in name


@dataclass(frozen=True)
class MeshSecret:
    """The secret every router of one address space logs in to the others with."""

    value: str = field(repr=False)

    @classmethod
    def read(cls, path: Path) -> MeshSecret:
        try:
            value = path.read_text().strip()
        except (OSError, UnicodeDecodeError) as error:
            raise MeshSecretError(f"cannot read mesh secret file {path}: {error}") from error
        if not value:
            raise MeshSecretError(f"mesh secret file {path} is empty")
        return cls(value)

    def admits(self, user: str, password: str) -> bool:
        """The inter-router listener's authenticator: a router id and the shared secret."""
        same = hmac.compare_digest(password.encode(), self.value.encode())
        return same and is_router_id(user)


def world_readable(path: Path) -> bool:
    """True when any user of the machine may read the file: worth a warning. (Group-readable is
    how Kubernetes mounts a Secret for a non-root pod, through fsGroup.)"""
    return bool(path.stat().st_mode & stat.S_IRWXO)
