"""Wildcard (`+`, `#`) and shared (`$share/group/filter`) subscriptions of one client.

What flows in: a SUBSCRIBE's filter and granted QoS, the router's messages on the filter's
pattern link (`enmasse.resources.address_patterns`: which addresses match, now and as the
space changes), an UNSUBSCRIBE. What flows out: the pattern link attached (or the router's
refusal, which the session turns into the SUBACK's reason: 0x87 for a user who may not receive
from everything the filter matches), and one receiving link per matched address, whose messages
the session publishes to the client under that address as topic.

Why so: the router matches (it is told of every new address first), so a filter sees addresses
created after the SUBSCRIBE; each message still travels on a link of its own address, so it
keeps that address's semantics and its topic. The SUBACK waits until the addresses that matched
at SUBSCRIBE time are joined (the router's `CURRENT`): what is published after it is received.

A shared subscription is one subscription per (group, filter) that the group's members compete
on. The members' links to a matched topic address carry the `shared` capability and a name that
starts with `mqtt-share:<group>:<filter>` (durable, expiry never): the brokers know them by that
name, so every member, through any gateway and router, consumes from the same subscription queue
and each message goes to one of them. A multicast address has no queue to compete on, so a
shared filter joins topic addresses only. The members close their links on UNSUBSCRIBE and when
the client goes: the last one to leave ends the group's subscription on the brokers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from enmasse.amqp import codec
from enmasse.amqp.engine import Delivery, Link, Outcome, Terminus
from enmasse.mqtt_gateway.uplink import Refused, Uplink
from enmasse.resources import address_patterns as patterns

log = structlog.get_logger("enmasse.mqtt_gateway")

SHARE_PREFIX = "$share/"
ANNOUNCEMENT_WINDOW = 100
"""Credit of a pattern link: the router's announcements it may have on their way."""
CURRENT_TIMEOUT = 10.0
"""Seconds a SUBSCRIBE waits for the router to tell the addresses its filter matches."""


def share_of(topic_filter: str) -> tuple[str | None, str]:
    """(group, filter) of a shared subscription's filter; (None, the filter) of another."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None, topic_filter
    group, _, inner = topic_filter[len(SHARE_PREFIX) :].partition("/")
    return group, inner


def share_problem(topic_filter: str) -> bool:
    """True for a `$share/` filter without a group name or filter (MQTT 5 4.8.2)."""
    group, inner = share_of(topic_filter)
    return group is not None and (not group or "+" in group or "#" in group or not inner)


def needs_pattern(topic_filter: str) -> bool:
    """True when the filter is served through a pattern link: a wildcard or a shared one."""
    group, inner = share_of(topic_filter)
    return group is not None or patterns.is_pattern(inner)


@dataclass(eq=False)
class Pattern:
    """One wildcard or shared filter: its pattern link and the subscriptions of its addresses
    (the session's `Subscription`s, made by `Wildcards.new_member`)."""

    topic_filter: str
    pattern: str
    group: str | None
    qos: int
    window: int  # the credit of each address link
    link: Link | None = None
    members: dict[str, Any] = field(default_factory=dict)  # address -> its Subscription
    joining: set[asyncio.Task[None]] = field(default_factory=set)
    current: asyncio.Event = field(default_factory=asyncio.Event)
    left: bool = False

    def holds(self, member: Any) -> bool:
        """True while `member` is this filter's subscription of its address."""
        return not self.left and self.members.get(member.topic) is member

    def source(self, address: str, kind: str) -> tuple[str | None, Terminus | None] | None:
        """The link name and source to receive from `address` with, or None when this filter
        does not join that address (a shared filter and a multicast address)."""
        if self.group is None:
            return None, None
        if kind != "topic":
            return None
        name = f"mqtt-share:{self.group}:{self.pattern}"
        shared = Terminus(
            address=address, durable=2, expiry_policy="never", capabilities=("shared",)
        )
        return name, shared


class Wildcards:
    """A client's wildcard and shared filters; runs on the session's asyncio loop."""

    def __init__(self, *, new_member: Callable[[str, int, Pattern], Any]) -> None:
        self.new_member = new_member
        self.filters: dict[str, Pattern] = {}

    async def subscribe(self, uplink: Uplink, topic_filter: str, qos: int, *, window: int) -> Link:
        """Attaches the filter's pattern link and joins what matches now; the pattern link,
        or Refused with the router's condition."""
        existing = self.filters.get(topic_filter)
        if existing is not None and existing.link is not None:
            self.requalify(topic_filter, qos)
            return existing.link
        group, inner = share_of(topic_filter)
        pattern = Pattern(
            topic_filter=topic_filter, pattern=inner, group=group, qos=qos, window=window
        )
        pattern.link = await uplink.attach_receiver(
            inner,
            receiver=pattern,
            credit=ANNOUNCEMENT_WINDOW,
            source=Terminus(address=inner, capabilities=(patterns.PATTERN_CAPABILITY,)),
        )
        self.filters[topic_filter] = pattern
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CURRENT_TIMEOUT):
                await pattern.current.wait()
                while pattern.joining:
                    await asyncio.gather(*pattern.joining, return_exceptions=True)
        return pattern.link

    def requalify(self, topic_filter: str, qos: int) -> None:
        """A repeated SUBSCRIBE: the new QoS for every address of the filter."""
        pattern = self.filters.get(topic_filter)
        if pattern is None:
            return
        pattern.qos = qos
        for member in pattern.members.values():
            member.qos = qos

    def announced(self, uplink: Uplink, pattern: Pattern, delivery: Delivery) -> None:
        """The router told the pattern link of a change: join or leave an address."""
        uplink.settle(delivery, Outcome.ACCEPTED)  # pre-settled; gives the credit back
        if pattern.left:
            return
        told = codec.read_application_properties(delivery.payload)
        event, address = told.get(patterns.EVENT), str(told.get(patterns.ADDRESS, ""))
        if event == patterns.CURRENT:
            pattern.current.set()
        elif event == patterns.MATCHED and address not in pattern.members:
            self._join(uplink, pattern, address, str(told.get(patterns.TYPE, "")))
        elif event == patterns.UNMATCHED:
            member = pattern.members.pop(address, None)
            if member is not None and member.link is not None:
                uplink.detach(member.link)

    def _join(self, uplink: Uplink, pattern: Pattern, address: str, kind: str) -> None:
        how = pattern.source(address, kind)
        if how is None:
            return
        name, source = how
        member = self.new_member(address, pattern.qos, pattern)
        pattern.members[address] = member  # before the attach: its first message finds it

        async def join() -> None:
            try:
                link = await uplink.attach_receiver(
                    address, receiver=member, credit=pattern.window, name=name, source=source
                )
            except Refused as refused:  # e.g. no recv on this one address: the others go on
                log.info(
                    "address of a filter refused",
                    filter=pattern.topic_filter,
                    address=address,
                    condition=str(refused),
                )
                if pattern.members.get(address) is member:
                    del pattern.members[address]
                return
            member.link = link
            if not pattern.holds(member):  # unsubscribed or unmatched meanwhile
                uplink.detach(link)

        task = asyncio.get_running_loop().create_task(join())
        pattern.joining.add(task)
        task.add_done_callback(pattern.joining.discard)

    def leave(self, uplink: Uplink | None, topic_filter: str) -> None:
        """UNSUBSCRIBE (or the client gone): every address link of the filter is closed (its
        pattern link is the session's to close)."""
        pattern = self.filters.pop(topic_filter, None)
        if pattern is None:
            return
        pattern.left = True  # a join still under way closes its link when it opens
        for member in pattern.members.values():
            if member.link is not None and uplink is not None:
                uplink.detach(member.link)
        pattern.members.clear()

    def leave_all(self, uplink: Uplink | None) -> None:
        for topic_filter in list(self.filters):
            self.leave(uplink, topic_filter)
