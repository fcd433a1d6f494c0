"""What one client connection may do on the message plane: its user's rules, as the router asks.

What flows in: who the connection logged in as (the engine's `conn.user`, read once when the
connection opens) and that user's rules in the running configuration (`RouterConfig.rules`,
replaced whole by each generation). What flows out: `Permissions`, kept on the connection's
record, which says whether the connection may `send` to or `recv` from an address, and the text of
the `amqp:unauthorized-access` refusal when it may not.

Why it is built so:
- the matching is `enmasse.resources.authorization.allows`, the matcher the config service
  validates patterns for, so a rule means here what it meant when it was accepted;
- an anonymous connection (no login, or SASL ANONYMOUS on a router started with
  `--client-auth anonymous|optional`) keeps full access for now: it is one explicit branch
  (`user is None`), so a policy for anonymous clients has one place to go;
- a connection logged in as a user gets that user's rules, whatever becomes of the user: a user
  removed from the configuration keeps its connections, with no rules, so it may do nothing;
- the router asks once per link, at attach, and keeps the answer on the link; only an anonymous
  relay link (no target, each message's `to`) asks per message, and only when its user's rules
  do not allow sending everywhere (`sends_everywhere`), through a per-link dict of decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

from enmasse.resources.authorization import SEND, Rule, allows, allows_everything

ANONYMOUS = "anonymous"
"""The user the engine names a SASL ANONYMOUS login (and proton's, without our SASL layer)."""


def logged_in_as(user: str | None, *, configured: dict[str, str]) -> str | None:
    """The user a connection's rules come from; None for an anonymous connection. A configured
    user named `anonymous` is a user like any other: its rules apply to whoever logs in so."""
    if user is None or (user == ANONYMOUS and ANONYMOUS not in configured):
        return None
    return user


@dataclass(frozen=True)
class Permissions:
    """What one connection may do; `user` None: an anonymous connection."""

    user: str | None
    rules: tuple[Rule, ...] = ()

    @property
    def sends_everywhere(self) -> bool:
        """True when no address needs a check before this connection sends to it."""
        return self.user is None or allows_everything(self.rules, SEND)

    def may(self, operation: str, address: str) -> bool:
        if self.user is None:
            return True  # anonymous access: full, until the anonymous-access policy says otherwise
        return allows(self.rules, operation, address)

    @property
    def who(self) -> str:
        return "an anonymous client" if self.user is None else f"user '{self.user}'"

    def refusal(self, operation: str, address: str) -> str:
        """The amqp:unauthorized-access description: who, which operation, which address."""
        direction = "to" if operation == SEND else "from"
        return f"{self.who} may not {operation} {direction} '{address}'"


UNRESTRICTED = Permissions(user=None)
