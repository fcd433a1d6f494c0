"""Who may connect to a router: the other routers of its space, and the space's messaging users.

What flows in: the mesh secret (a file the runtime renders once per address space, read at
start-up) and the users of the running configuration (username -> scrypt hash, as the config
service stores them; each pushed generation replaces them whole). What flows out: the two
`authenticator(user, password) -> bool` callables the engine's own SASL layer calls
(`enmasse.amqp.sasl`), one for the inter-router listener and one for the client listener.

Why it is built so:
- a router logs in to a peer with SASL PLAIN, user = its router id, password = the space's
  secret; the secret is compared in constant time, and the listener offers no ANONYMOUS, so a
  stranger's connection ends in the SASL exchange with amqp:unauthorized-access, before it can
  open a link, advertise a route or count as a neighbour;
- a user's password is checked against its scrypt hash (`enmasse.common.passwords`), which costs
  tens of milliseconds, on one of the engine's two login threads (the engine's thread goes on
  serving every other connection meanwhile; the dict of remembered logins is only read and set
  whole, entry by entry, which needs no lock). A successful login is remembered as an HMAC of the
  password under a key that lives only in this process, next to the hash it matched, so a client
  that reconnects costs microseconds; a new hash (password changed) or a user removed from the
  configuration forgets it. Failed logins are not remembered: each one pays the full scrypt
  (unless the user's good password is remembered: then nothing else can match its hash).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from enmasse.common.passwords import verify_password


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


class UserLogins:
    """The client listener's authenticator: SASL PLAIN against the configuration's users."""

    def __init__(self, users: Callable[[], Mapping[str, str]]) -> None:
        self._users = users  # read at each login: the running configuration's, whichever it is
        self._key = secrets.token_bytes(32)
        self._remembered: dict[str, tuple[str, bytes]] = {}  # user -> (hash, HMAC of password)

    def __call__(self, user: str, password: str) -> bool:
        stored = self._users().get(user)
        if stored is None:
            self._remembered.pop(user, None)
            return False
        mac = hmac.new(self._key, password.encode(), hashlib.sha256).digest()
        known = self._remembered.get(user)
        if known is not None and known[0] == stored:
            # Only the remembered password matches this hash (scrypt has no practical collisions).
            return hmac.compare_digest(known[1], mac)
        if not verify_password(password, stored):
            return False
        self._remembered[user] = (stored, mac)
        return True
