"""Pattern receivers: links that follow every address of the space a pattern matches.

What flows in: a client's receiver that asks for an address pattern (source capability
`address_patterns.PATTERN_CAPABILITY`, the contract in `enmasse.resources.address_patterns`), with
what its user may do; each configuration the router applies; the link's detach. What flows out: the
attach accepted or refused (`amqp:invalid-field` for a pattern that is not one,
`amqp:unauthorized-access` for a user who may not receive from all it can match), and on each link
pre-settled, empty messages telling which addresses match (`MATCHED`, then `CURRENT` once the
addresses of the moment are told; later `MATCHED` or `UNMATCHED` as the configuration changes). The
client receives from each address on an ordinary link. They are sent whatever the link's credit: the
engine holds what the credit does not cover yet (a space's addresses, at most), so no credit event
of the router's has to look for pattern links.

Why so: the router matches (it knows the space's addresses and hears of every new one first,
from the router-agent), the messages still travel on per-address links. So the work is done at
attach and at configuration change only: the forwarding path, the multicast fan-out and the
broker feeds of topics are exactly those of any receiver, a message pays nothing for patterns,
and each address keeps its semantics (a topic subscription on the brokers, a multicast copy).
`matched_addresses` and `pattern_refusal` are the pure part (which addresses match, who may hold
a pattern); `PatternLinks` keeps what each link was told and tells it what changed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from enmasse.amqp import codec
from enmasse.amqp.engine import Condition, Link
from enmasse.resources import address_patterns as patterns
from enmasse.resources.authorization import RECV
from enmasse.resources.permissions import Permissions
from enmasse.router.config import RouterConfig

UNAUTHORIZED = "amqp:unauthorized-access"
_RULE_SEPARATORS = re.compile(r"[/.]")


def matched_addresses(pattern: str, config: RouterConfig) -> dict[str, str]:
    """The space's addresses (of `PATTERN_TYPES`) that `pattern` matches -> their type."""
    return {
        address: route.distribution.value
        for address, route in config.addresses.items()
        if route.distribution.value in patterns.PATTERN_TYPES and patterns.matches(pattern, address)
    }


def pattern_refusal(permissions: Permissions, pattern: str) -> str | None:
    """Why this connection may not hold a receiver on `pattern`, or None: it needs `recv` on
    every address the pattern can match, existing or not (`address_patterns.recv_probes`)."""
    if permissions.user is None:
        return None
    longest = max(
        (len(_RULE_SEPARATORS.split(p)) for rule in permissions.rules for p in rule.addresses),
        default=0,
    )
    allowed = patterns.may_receive_all(
        pattern, may_recv=lambda address: permissions.may(RECV, address), depth=longest + 1
    )
    if allowed:
        return None
    return (
        f"{permissions.who} may not recv from every address '{pattern}' matches: "
        "a pattern receiver needs recv on all of them"
    )


@dataclass(eq=False)
class PatternReceiver:
    """One pattern link: its pattern, and what it was told matches."""

    link: Link
    pattern: str
    told: dict[str, str] = field(default_factory=dict)  # address -> type, as told

    def wanted(self, config: RouterConfig) -> dict[str, str]:
        """The addresses it should be told of now: matched, and receivable by its user."""
        permissions: Permissions = self.link.connection.context.permissions
        return {
            address: kind
            for address, kind in matched_addresses(self.pattern, config).items()
            if permissions.may(RECV, address)
        }


def announcement(event: str, *, address: str = "", kind: str = "") -> bytes:
    """The message that tells a pattern link of one change."""
    properties = {patterns.EVENT: event}
    if address:
        properties |= {patterns.ADDRESS: address, patterns.TYPE: kind}
    return codec.encode_message(b"", application_properties=properties)


class PatternLinks:
    """The router's pattern receivers (engine thread only)."""

    def __init__(self) -> None:
        self.receivers: dict[Link, PatternReceiver] = {}

    def attach(self, link: Link, *, permissions: Permissions, config: RouterConfig) -> None:
        pattern = link.address or ""
        problem = patterns.pattern_problem(pattern)
        if problem is not None:
            link.refuse(Condition("amqp:invalid-field", problem))
            return
        refusal = pattern_refusal(permissions, pattern)
        if refusal is not None:
            link.refuse(Condition(UNAUTHORIZED, refusal))
            return
        link.accept()
        receiver = PatternReceiver(link=link, pattern=pattern)
        self.receivers[link] = receiver
        self._tell_changes(receiver, receiver.wanted(config))
        self._tell(receiver, announcement(patterns.CURRENT))

    def detach(self, link: Link) -> None:
        self.receivers.pop(link, None)

    def config_changed(self, config: RouterConfig) -> None:
        """Each pattern link is told the addresses that began or stopped matching; a link whose
        user lost the right to its pattern (changed rules) is closed."""
        for link, receiver in list(self.receivers.items()):
            permissions: Permissions = link.connection.context.permissions
            refusal = pattern_refusal(permissions, receiver.pattern)
            if refusal is not None:
                self.receivers.pop(link, None)
                link.close(Condition(UNAUTHORIZED, refusal))
                continue
            self._tell_changes(receiver, receiver.wanted(config))

    def _tell_changes(self, receiver: PatternReceiver, wanted: dict[str, str]) -> None:
        told = receiver.told
        for address in sorted(told.keys() - wanted.keys()):
            self._tell(receiver, announcement(patterns.UNMATCHED, address=address))
            del told[address]
        for address, kind in sorted(wanted.items()):
            if told.get(address) == kind:
                continue
            if address in told:  # its type changed: gone as it was, back as it is
                self._tell(receiver, announcement(patterns.UNMATCHED, address=address))
            self._tell(receiver, announcement(patterns.MATCHED, address=address, kind=kind))
            told[address] = kind

    @staticmethod
    def _tell(receiver: PatternReceiver, message: bytes) -> None:
        receiver.link.send_settled(message)
