"""The target side of a drain: what a draining broker asks this one to hold, and who may send it.

What flows in: `PrepareDrain` (BrokerAdmin) with the queues and topics the source will move, each
with its plan, and for a topic the identities of its durable subscriptions. What flows out: the
addresses created here (by the broker, with the same plans, in one catalog commit) and a token,
which the source's AMQP connection presents as the open-frame property `enmasse-drain-token`.

Why a token: a durable subscription queue (`<topic>::<identity>`) is normally fed only by its
topic, so a client must never be able to attach a sending link to one and inject messages that
the subscriber would take for published ones. A drain has to do exactly that, to land messages in
the same subscription. Only a caller of BrokerAdmin (the control plane) can obtain a token, so a
connection that presents one is a drain; any other sending link to `T::id` is refused with
`amqp:unauthorized-access`. A token serves one connection: it is redeemed (forgotten) when that
connection attaches its first sending link, so one seen on the wire is worth nothing after.
Names, plans and identities are checked like BrokerAdmin's own names before anything is
created, and a bad one changes nothing.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

from enmasse.broker.plan import Plan

DRAIN_TOKEN_PROPERTY = "enmasse-drain-token"
_KEEP_TOKENS = 64  # drains in flight at once are few; the oldest token goes first
_MAX_IDENTITY = 1024


@dataclass(frozen=True)
class InboxAddress:
    """One address a drain will move: a queue, or a topic and its durable subscriptions."""

    name: str
    kind: str  # queue, topic
    plan: Plan
    subscriptions: tuple[str, ...] = field(default=())


def identity_problem(identity: str) -> str | None:
    """Why `identity` cannot name a durable subscription, or None when it can."""
    if not identity:
        return "subscription identity must not be empty"
    if len(identity) > _MAX_IDENTITY:
        return f"subscription identity is longer than {_MAX_IDENTITY} characters"
    if not identity.isprintable():
        return f"subscription identity {identity!r} holds control characters"
    return None


class DrainTokens:
    """Tokens handed out by PrepareDrain; a connection presenting one may feed subscriptions."""

    def __init__(self) -> None:
        self._issued: OrderedDict[str, None] = OrderedDict()

    def issue(self) -> str:
        token = secrets.token_urlsafe(24)
        self._issued[token] = None
        while len(self._issued) > _KEEP_TOKENS:
            self._issued.popitem(last=False)
        return token

    def valid(self, token: object) -> bool:
        return isinstance(token, str) and token in self._issued

    def redeem(self, token: object) -> bool:
        """True once for an issued token (the drain's connection), False ever after."""
        if not self.valid(token):
            return False
        del self._issued[token]  # type: ignore[arg-type]
        return True
