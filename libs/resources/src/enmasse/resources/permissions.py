"""What one client connection may do on the message plane: its user's rules, as an endpoint asks.

What flows in: who the connection logged in as (the engine's `conn.user`, read once when the
connection opens) and that user's rules as its client endpoint holds them (a router's
`RouterConfig.rules`, a brokered space's broker's client access: each replaced whole by the next
push). What flows out: `Permissions`, kept with the connection, which says whether it may `send`
to an address, `recv` from it or browse it (`view`), and the text of the
`amqp:unauthorized-access` refusal when it may not (`refusal`, `receive_refusal`).

Why it is built so:
- every client endpoint asks here (the routers of a standard space, the broker of a brokered
  one), and the matching is `enmasse.resources.authorization.allows`, the matcher the config
  service validates patterns with, so a rule means the same wherever it was accepted or is used;
- a receiver that browses (its source asks distribution-mode `copy`: it sees a queue's messages
  and takes none) needs `view` or `recv` on the address (`receive_refusal`): a `view` rule grants
  browsing only, `recv` implies it. Only a queue (or a subscription's queue) is browsed: on any
  other address a `copy` receiver gets messages like any consumer (an anycast one takes them from
  the others, a topic's gets every one published), so there it needs `recv`. Whether the address
  is a queue is asked last (`is_queue`), and only of a user who may view it: a user with no right
  on an address learns nothing of it, not even whether it exists;
- an anonymous connection (no login, or SASL ANONYMOUS where the space plan allows it, or a
  router started with `--client-auth anonymous|optional`) has full access: it is one explicit
  branch (`user is None`), so a policy for anonymous clients has one place to go;
- a connection logged in as a user gets that user's rules, whatever becomes of the user: a user
  removed from the configuration keeps its connections, with no rules, so it may do nothing;
- an endpoint asks once per link, at attach, and keeps the answer on the link; only an anonymous
  relay link (no target, each message's `to`) asks per message, and only when its user's rules
  do not allow sending everywhere (`sends_everywhere`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from enmasse.resources.authorization import RECV, SEND, VIEW, Rule, allows, allows_everything

ANONYMOUS: Final = "anonymous"
"""The user the engine names a SASL ANONYMOUS login (and proton's, without our SASL layer)."""
BROWSE: Final = "copy"
"""The source distribution-mode of a receiver that browses."""


def logged_in_as(user: str | None, *, configured: dict[str, str]) -> str | None:
    """The user a connection's rules come from; None for an anonymous connection. A configured
    user named `anonymous` is a user like any other: its rules apply to whoever logs in so."""
    if user is None or (user == ANONYMOUS and ANONYMOUS not in configured):
        return None
    return user


def browses(distribution_mode: str | None) -> bool:
    """True for a receiver whose source distribution-mode asks to browse."""
    return distribution_mode == BROWSE


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
        if operation == VIEW and allows(self.rules, RECV, address):
            return True  # who may take the messages may look at them
        return allows(self.rules, operation, address)

    @property
    def who(self) -> str:
        return "an anonymous client" if self.user is None else f"user '{self.user}'"

    def refusal(self, operation: str, address: str) -> str:
        """The amqp:unauthorized-access description: who, which operation, which address."""
        if operation == SEND:
            return f"{self.who} may not send to '{address}'"
        if operation == VIEW:
            return f"{self.who} may not view '{address}'"
        return f"{self.who} may not {operation} from '{address}'"

    def receive_refusal(
        self, address: str, *, browse: bool, is_queue: Callable[[], bool]
    ) -> str | None:
        """Why this connection may not attach a receiver to `address` (`browse`: its source asks
        distribution-mode `copy`; `is_queue`: whether the address is browsed there), or None."""
        if self.may(RECV, address):
            return None
        if not browse:
            return self.refusal(RECV, address)
        if not self.may(VIEW, address):
            return self.refusal(VIEW, address)
        if is_queue():
            return None
        return f"{self.refusal(RECV, address)}: only a queue is browsed"


UNRESTRICTED = Permissions(user=None)
