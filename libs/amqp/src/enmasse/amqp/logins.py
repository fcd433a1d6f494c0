"""Who may log in to a client endpoint: its space's users as last pushed, and its plan's policy.

What flows in: a function that returns the endpoint's running `LoginSource` (a router's
RouterConfig, a brokered space's broker's client access: the users (username -> scrypt hash, and
their SCRAM keys by mechanism) and the login policy (ANONYMOUS? PLAIN without TLS?), each push
replacing them whole). What flows out: `UserLogins`, the `sasl.Authenticator` the engine's own
SASL layer asks on the client listener of every router and of a brokered space's broker.

Why it is built so:
- the listener offers SCRAM-SHA-512 and SCRAM-SHA-256 (checked on the engine thread against the
  user's stored keys: HMACs, no key derivation), PLAIN over TLS, and what the policy allows
  besides; `lax` (a router's `--client-auth optional`: tests, benches) lets ANONYMOUS in and
  PLAIN without TLS whatever the policy says;
- an endpoint that has received no users yet (a broker just started, before the
  storage-controller pushed its access) has an empty source: every login fails, nobody comes in
  anonymously unless a policy that allows it was pushed;
- a PLAIN password is checked against its scrypt hash (`enmasse.common.passwords`), which costs
  tens of milliseconds, on one of the engine's login threads (the engine's thread goes on
  serving every other connection meanwhile; the dict of remembered logins is only read and set
  whole, entry by entry, which needs no lock). A successful login is remembered as an HMAC of the
  password under a key that lives only in this process, next to the hash it matched, so a client
  that reconnects is answered on the engine thread in microseconds (`recall`), queued behind
  nothing; a new hash (password changed) or a user removed from the source forgets it. Failed
  logins are not remembered: each one pays the full scrypt (unless the user's good password is
  remembered: then nothing else can match its hash), which is why the engine's login throttle
  backs off and then turns away peers and users that keep failing (`enmasse.amqp.throttle`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Mapping
from typing import Protocol

from enmasse.amqp import sasl
from enmasse.common.passwords import ScramKeys, verify_password


class LoginSource(Protocol):
    """What `UserLogins` reads of an endpoint's running configuration at each login."""

    @property
    def users(self) -> Mapping[str, str]:
        """username -> stored scrypt hash"""
        ...

    @property
    def scram(self) -> Mapping[str, Mapping[str, ScramKeys]]:
        """username -> mechanism -> the user's SCRAM keys"""
        ...

    @property
    def allow_anonymous(self) -> bool: ...

    @property
    def allow_plain_without_tls(self) -> bool: ...


class UserLogins:
    """The client listener's authenticator (`sasl.Authenticator`): the source's users and login
    policy; `lax` lets ANONYMOUS and PLAIN without TLS in."""

    def __init__(self, source: Callable[[], LoginSource], *, lax: bool = False) -> None:
        self._source = source  # read at each login: the running configuration, whichever it is
        self._lax = lax
        self._key = secrets.token_bytes(32)
        self._remembered: dict[str, tuple[str, bytes]] = {}  # user -> (hash, HMAC of password)

    def mechanisms(self, *, encrypted: bool) -> tuple[str, ...]:
        source = self._source()
        return sasl.offered(
            scram=True,
            plain=encrypted or self._lax or source.allow_plain_without_tls,
            anonymous=self._lax or source.allow_anonymous,
        )

    def recall(self, user: str, password: str) -> bool | None:
        """A remembered login's answer (an HMAC), False for a user not configured; None: the
        scrypt hash must say."""
        stored = self._source().users.get(user)
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
        stored = self._source().users.get(user)
        if stored is None or not verify_password(password, stored):
            return False
        self._remembered[user] = (stored, self._mac(password))
        return True

    def scram_keys(self, mechanism: str, user: str) -> ScramKeys | None:
        return self._source().scram.get(user, {}).get(mechanism)

    def _mac(self, password: str) -> bytes:
        return hmac.new(self._key, password.encode(), hashlib.sha256).digest()
