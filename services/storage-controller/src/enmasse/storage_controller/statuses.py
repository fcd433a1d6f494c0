"""What each Address status must say about its placement, and the placement statuses record. Pure.

In: an Address (with the status it has now), the space's `Placement`, which of its brokers
already hold it, and a broker's refusal if any. Out: the `AddressStatus` to write, or the very
status it has when nothing changed (the controller writes only differences).

The division of labour with the router-agent: this controller writes `status.brokers` (each
broker with state Active, or Draining while the address's messages leave it) and the phase up to
Configuring; in a standard space `Active` is the router-agent's to set, once every router runs
the address. So an Active address whose brokers did not change and whose brokers all hold it is
left exactly as it is, and so is one the router-agent took back to Configuring because a router
lost it (what this controller would write, with the agent's reason after it: `says_first`).
Whether a placed broker holds the address yet is said in the placement itself: an Active
broker that lacks it is `waiting` (with a `reason`), which the router-agent reads to keep it out
of the route; a Draining broker holds what it drains and never waits. The flag is a plain
function of the placement and `ready`, so an unchanged pass writes nothing.
Messages say the same for people, and are stable: `placed on broker(s) a, b`, then
`broker ready: a, b` or `waiting for broker: a`, and `draining from broker: c` while messages move.

A brokered space has no routers: its clients talk to its one broker directly, so nobody else
could ever say Active. Here an address is Active as soon as its broker holds it, and the
AddressSpace status (`space_status`) is Active with the broker's AMQP port as its `amqp`
endpoint (and its TLS port as `amqps`) once that broker answers; Configuring, saying what it
waits for, until then.

The dead letters an address's brokers count (`dead_letters_of`, from their ListAddresses: how
many of its messages became dead letters, how many are held in it for want of a dead-letter
queue) go into the status too, summed over its brokers; while one of them does not answer, the
status keeps the figures it has, so a blip does not rewrite it.

And back: `recorded_placement` rebuilds a space's placement from what it wrote (the rendered
brokers plus the addresses' `status.brokers`), so a restarted controller moves nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from enmasse.resources.contracts import ACTIVE, CONFIGURING, DRAINING, FAILED, PENDING
from enmasse.resources.discovery import BrokerEndpoint, client_endpoints
from enmasse.resources.rendered_brokers import BrokerWorkload
from enmasse.storage_controller.placement import Placement
from enmasse.v1 import broker_pb2, resources_pb2


@dataclass(frozen=True)
class DeadLetters:
    """An address's dead letters, summed over its brokers (`AddressStatus.dead_lettered`,
    `dead_letters_held`)."""

    dead_lettered: int = 0
    held: int = 0


def dead_letters_of(
    node: str, listings: Sequence[Mapping[str, broker_pb2.BrokerAddress] | None]
) -> DeadLetters | None:
    """The dead letters of broker node `node` (a queue or topic name, `<topic>::<name>` for a
    subscription) on the brokers whose listings (by node name) are given; None when a broker
    did not answer (None in `listings`) or there is none: the status keeps what it says."""
    if not listings or any(listing is None for listing in listings):
        return None
    found = [listing[node] for listing in listings if listing is not None and node in listing]
    return DeadLetters(
        dead_lettered=sum(a.dead_lettered for a in found),
        held=sum(a.dead_letters_held for a in found),
    )


def address_status(
    *,
    address: resources_pb2.Address,
    placement: Placement,
    ready: Collection[str],
    refusal: str = "",
    brokered: bool = False,
    dead_letters: DeadLetters | None = None,
) -> resources_pb2.AddressStatus:
    """The status to write (see the module docstring); `dead_letters` None keeps the figures
    the status has."""
    status = _placed_status(
        address=address, placement=placement, ready=ready, refusal=refusal, brokered=brokered
    )
    now = address.status
    figures = dead_letters or DeadLetters(now.dead_lettered, now.dead_letters_held)
    if (status.dead_lettered, status.dead_letters_held) == (figures.dead_lettered, figures.held):
        return status
    out = resources_pb2.AddressStatus()
    out.CopyFrom(status)  # `status` may be the address's own: never changed in place
    out.dead_lettered, out.dead_letters_held = figures.dead_lettered, figures.held
    return out


def _placed_status(
    *,
    address: resources_pb2.Address,
    placement: Placement,
    ready: Collection[str],
    refusal: str,
    brokered: bool,
) -> resources_pb2.AddressStatus:
    name = address.metadata.name
    generation = address.metadata.generation
    active = placement.addresses.get(name, ())
    leaving = placement.moves.get(name, ())
    if name in placement.pending:
        # a Pending address that still has messages somewhere says where, so they are kept
        entries = _placement(active, leaving)
        return _status(PENDING, [placement.pending[name]], generation=generation, brokers=entries)
    if refusal:
        entries = _placement(active, leaving)
        return _status(FAILED, [refusal], generation=generation, brokers=entries)
    waiting = [b for b in active if b not in ready]
    entries = _placement(active, leaving, waiting=waiting)
    now = address.status
    unchanged = list(now.brokers) == entries and now.status.observed_generation == generation
    if unchanged and now.status.phase == ACTIVE and not waiting:
        return now
    messages = [f"placed on broker{'s' if len(active) > 1 else ''} {', '.join(active)}"]
    if waiting:
        messages.append(f"waiting for broker: {', '.join(waiting)}")
    else:
        messages.append(f"broker ready: {', '.join(active)}")
    if leaving:
        messages.append(f"draining from broker: {', '.join(leaving)}")
    # no router will ever report a brokered address: its broker holding it is all there is
    phase = ACTIVE if brokered and active and not waiting and not leaving else CONFIGURING
    if unchanged and now.status.phase == phase and says_first(now.status.messages, messages):
        return now  # what we would write, plus the router-agent's reason after it
    return _status(phase, messages, generation=generation, brokers=entries)


def says_first(messages: Sequence[str], ours: Sequence[str]) -> bool:
    """True when `messages` begin with `ours`. The router-agent takes an Active address back to
    Configuring when a router loses it, and adds its reason after ours (`waiting for router r0:
    unreachable`); rewriting that status without it would have the two undo each other's
    writes. Nothing is parsed: ours are compared whole, theirs are never read."""
    return list(messages[: len(ours)]) == list(ours)


WAITING_REASON = "the broker does not hold the address yet"  # the one reason a broker waits


def _placement(
    active: Sequence[str], leaving: Sequence[str], *, waiting: Collection[str] = ()
) -> list[resources_pb2.BrokerPlacement]:
    """`status.brokers`: the Active brokers, each saying whether it still waits for the address,
    then the Draining ones. Pending and Failed statuses leave `waiting` unset: their messages
    speak of the quota or the refusal, and the placement says no more than they do."""
    entries = [
        resources_pb2.BrokerPlacement(
            broker=b,
            state=ACTIVE,
            waiting=b in waiting,
            reason=WAITING_REASON if b in waiting else "",
        )
        for b in active
    ]
    entries += [resources_pb2.BrokerPlacement(broker=b, state=DRAINING) for b in leaving]
    return entries


def space_status(
    *,
    space: resources_pb2.AddressSpace,
    placement: Placement,
    broker: BrokerEndpoint | None,
) -> resources_pb2.AddressSpaceStatus:
    """A brokered space's status: Active with its broker's `amqp` and `amqps` endpoints once
    the broker answers (`broker` is where it listens then, None while it does not answer)."""
    generation = space.metadata.generation
    brokers = sorted(b.id for b in placement.brokers.values() if b.state == ACTIVE)
    if not brokers:
        return _space_status(
            CONFIGURING, ["no broker yet: the first address starts it"], generation=generation
        )
    if broker is None:
        return _space_status(
            CONFIGURING, [f"waiting for broker: {brokers[0]}"], generation=generation
        )
    return _space_status(
        ACTIVE,
        [f"broker ready: {brokers[0]}"],
        generation=generation,
        endpoints=client_endpoints([broker]),
    )


def _space_status(
    phase: str,
    messages: list[str],
    *,
    generation: int,
    endpoints: Sequence[resources_pb2.Endpoint] = (),
) -> resources_pb2.AddressSpaceStatus:
    return resources_pb2.AddressSpaceStatus(
        status=resources_pb2.Status(phase=phase, messages=messages, observed_generation=generation),
        endpoints=endpoints,
    )


def _status(
    phase: str,
    messages: list[str],
    *,
    generation: int,
    brokers: Sequence[resources_pb2.BrokerPlacement] = (),
) -> resources_pb2.AddressStatus:
    return resources_pb2.AddressStatus(
        status=resources_pb2.Status(phase=phase, messages=messages, observed_generation=generation),
        brokers=brokers,
    )


def recorded_placement(
    *,
    space: str,
    workloads: Mapping[str, BrokerWorkload],
    addresses: Sequence[resources_pb2.Address],
) -> Placement:
    """The placement the controller last wrote; brokers whose files are gone are forgotten."""
    brokers = {broker_id: w.broker for broker_id, w in workloads.items()}
    placed: dict[str, tuple[str, ...]] = {}
    moves: dict[str, tuple[str, ...]] = {}
    for address in addresses:
        name = address.metadata.name
        active = tuple(
            e.broker for e in address.status.brokers if e.state != DRAINING and e.broker in brokers
        )
        leaving = tuple(
            e.broker for e in address.status.brokers if e.state == DRAINING and e.broker in brokers
        )
        if active:
            placed[name] = active
        if leaving:
            moves[name] = leaving
    return Placement(space=space, brokers=brokers, addresses=placed, moves=moves)
