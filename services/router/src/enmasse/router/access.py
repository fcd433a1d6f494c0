"""Who may connect to a router: the other routers of its space, and the space's messaging users.

What flows in: the mesh secret (a file the runtime renders once per address space, read at
start-up) and the running configuration: its users (username -> scrypt hash and SCRAM keys, as
the config service stores them) and its login policy (from the space plan: ANONYMOUS? PLAIN
without TLS?); each pushed generation replaces them whole. What flows out: the two
`sasl.Authenticator`s the engine's own SASL layer asks (`enmasse.amqp.sasl`), one for the
inter-router listener and one for the client listener.

Why it is built so:
- a router logs in to a peer with SASL PLAIN, user = its router id, password = the space's
  secret; the secret is compared in constant time, and the listener offers no ANONYMOUS, so a
  stranger's connection ends in the SASL exchange with amqp:unauthorized-access, before it can
  open a link, advertise a route or count as a neighbour;
- the client port offers SCRAM-SHA-512 and SCRAM-SHA-256 (checked on the engine thread against
  the user's stored keys: HMACs, no key derivation), PLAIN over TLS, and what the mode allows
  besides: `--client-auth optional` (tests, benches) lets ANONYMOUS in and PLAIN without TLS,
  `required` (every rendered router) only what the space plan allows (`RouterConfig`);
- a PLAIN password is checked against its scrypt hash (`enmasse.common.passwords`), which costs
  tens of milliseconds, on one of the engine's login threads (the engine's thread goes on
  serving every other connection meanwhile; the dict of remembered logins is only read and set
  whole, entry by entry, which needs no lock). A successful login is remembered as an HMAC of the
  password under a key that lives only in this process, next to the hash it matched, so a client
  that reconnects is answered on the engine thread in microseconds (`recall`), queued behind
  nothing; a new hash (password changed) or a user removed from the configuration forgets it.
  Failed logins are not remembered: each one pays the full scrypt (unless the user's good
  password is remembered: then nothing else can match its hash), which is why the engine's login
  throttle backs off and then turns away peers and users that keep failing
  (`enmasse.amqp.throttle`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from enmasse.amqp import sasl
from enmasse.common.passwords import ScramKeys, verify_password
from enmasse.router.config import RouterConfig


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
    """The client listener's authenticator (`sasl.Authenticator`): the configuration's users and
    login policy; `lax` (`--client-auth optional`) lets ANONYMOUS and PLAIN without TLS in."""

    def __init__(self, config: Callable[[], RouterConfig], *, lax: bool = False) -> None:
        self._config = config  # read at each login: the running configuration, whichever it is
        self._lax = lax
        self._key = secrets.token_bytes(32)
        self._remembered: dict[str, tuple[str, bytes]] = {}  # user -> (hash, HMAC of password)

    def mechanisms(self, *, encrypted: bool) -> tuple[str, ...]:
        config = self._config()
        return sasl.offered(
            scram=True,
            plain=encrypted or self._lax or config.allow_plain_without_tls,
            anonymous=self._lax or config.allow_anonymous,
        )

    def recall(self, user: str, password: str) -> bool | None:
        """A remembered login's answer (an HMAC), False for a user not configured; None: the
        scrypt hash must say."""
        stored = self._config().users.get(user)
        if stored is None:
            self._remembered.pop(user, None)
            return False
        known = self._remembered.get(user)
        if known is None or known[0] != stored:
            return None
        # Only the remembered password matches this hash (scrypt has no practical collisions).
        return hmac.compare_digest(known[1], self._mac(password))

    def check(self, user: str, password: str) -> bool:
        """The full check against the scrypt hash (a login thread); a match is remembered."""
        remembered = self.recall(user, password)
        if remembered is not None:
            return remembered
        stored = self._config().users.get(user)
        if stored is None or not verify_password(password, stored):
            return False
        self._remembered[user] = (stored, self._mac(password))
        return True

    def scram_keys(self, mechanism: str, user: str) -> ScramKeys | None:
        return self._config().scram.get(user, {}).get(mechanism)

    def _mac(self, password: str) -> bytes:
        return hmac.new(self._key, password.encode(), hashlib.sha256).digest()
