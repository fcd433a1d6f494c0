"""The broker's anonymous relay: one sending link with no target address, each message going to
the address in its own `to`.

What flows in: a client's link attached with a null target (what proton's `server.py` and every
JMS `MessageProducer` created without a destination attach to send replies), then its messages,
each naming its address in the properties' `to`: a queue, a topic, or a dynamic reply address.
What flows out: for each message, the address it goes to, or the condition its delivery alone is
rejected with, the link staying up:
- no `to`: amqp:precondition-failed, the router's words ("a message on an anonymous link needs a
  'to' address"); a `to` that cannot be read: amqp:decode-error;
- a `to` the user may not send to (a brokered space's broker, `ClientEndpoint.send_refusal`):
  amqp:unauthorized-access with the router's words ("user 'sender' may not send to 'pq2'");
- a subscription queue (`<topic>::<identity>`, a drain's only): amqp:unauthorized-access, as at
  an attach; a reply address that is gone, or an address this broker does not hold:
  amqp:not-found naming it, as at an attach.

Why it is built so: a standard space's router already relays by `to` (`enmasse.router.forwarding`,
`_route_anonymous`), with the same refusals; a brokered space's broker is its space's client
endpoint, so the same client works against either. The access decision is the only one that may
cost (rule patterns): it is taken once per link and address and kept on the link (`Relay`), up to
`MAX_SEND_DECISIONS` addresses, and dropped when a new client access is pushed
(`ClientEndpoint.generation`); what remains per message is reading `to` and two dict lookups for
the address, which may come and go. Named links never come here: a connection's messages take
this path only once it attached a relay link (the handler swaps its `on_message` then, as it does
for a drain).
"""

from __future__ import annotations

from enmasse.amqp import codec
from enmasse.amqp.engine import Condition, Delivery, Link
from enmasse.broker.broker import Broker
from enmasse.broker.clients import UNAUTHORIZED, ClientEndpoint
from enmasse.resources.contracts import SUBSCRIPTION_SEPARATOR, dynamic_owner

NOT_FOUND = "amqp:not-found"
DECODE_ERROR = "amqp:decode-error"
PRECONDITION_FAILED = "amqp:precondition-failed"
NO_TO = Condition(PRECONDITION_FAILED, "a message on an anonymous link needs a 'to' address")
# A relay replying to many reply addresses must not grow its decisions without end.
MAX_SEND_DECISIONS = 1024


class Relay:
    """A receiving link of ours with no target address: `link.context` (the handler keeps its
    credit as for a named producer, in the same fields as `handler.Producer`: `address` is the
    last address a message went to, whose room the next credit waits for)."""

    __slots__ = (
        "_decisions",
        "_generation",
        "address",
        "credit_left",
        "granted",
        "link",
        "refill_below",
        "taken_bytes",
        "waiting",
        "window",
    )

    def __init__(self, link: Link, *, window: int) -> None:
        self.link = link
        self.address = ""
        self.waiting = False
        self.credit_left = 0
        self.window = window  # the credit fields: as `handler.Producer`'s
        self.granted = 0
        self.taken_bytes = 0
        self.refill_below = 1
        self._decisions: dict[str, Condition | None] = {}  # `to` -> refusal, or None: allowed
        self._generation = -1

    def destination(
        self, delivery: Delivery, *, broker: Broker, clients: ClientEndpoint | None
    ) -> str | Condition:
        """Where the message goes, or why its delivery is rejected (see the module docstring)."""
        try:
            to = delivery.to
        except (codec.CodecError, IndexError, ValueError) as error:  # as on_message's decode
            return Condition(DECODE_ERROR, f"cannot read the message's 'to': {error}")
        if not to:
            return NO_TO
        refusal = self._refusal(to, clients)
        if refusal is not None:
            return refusal
        if broker.find_queue(to) is None and to not in broker.topics:
            return Condition(NOT_FOUND, _missing(to))
        return to

    def _refusal(self, to: str, clients: ClientEndpoint | None) -> Condition | None:
        """The access decision for `to`, taken once per link and address (per client access)."""
        generation = clients.generation if clients is not None else 0
        if generation != self._generation or len(self._decisions) >= MAX_SEND_DECISIONS:
            self._decisions.clear()
            self._generation = generation
        try:
            return self._decisions[to]
        except KeyError:
            pass
        refusal = _decide(self.link, to, clients)
        self._decisions[to] = refusal
        return refusal


def _decide(link: Link, to: str, clients: ClientEndpoint | None) -> Condition | None:
    if SUBSCRIPTION_SEPARATOR in to:
        return Condition(
            UNAUTHORIZED,
            f"{to!r} is a subscription queue: only a drain from another broker "
            "(with a PrepareDrain token) may send to it",
        )
    if clients is None:
        return None  # a standard space's broker: its routers checked the client already
    refusal = clients.send_refusal(link.connection, to)
    return Condition(UNAUTHORIZED, refusal) if refusal is not None else None


def _missing(address: str) -> str:
    """The amqp:not-found description for an address this broker does not hold (the attach's)."""
    if dynamic_owner(address) is not None:
        return (
            f"reply address {address!r} is gone: the receiver that asked for it detached, "
            "or its connection closed"
        )
    return f"no queue or topic {address!r} on this broker"
