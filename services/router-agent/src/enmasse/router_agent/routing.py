"""From declared addresses to what each router of a space must run, and back to address phases.

In: the Address resources of one space (spec and the storage-controller's placement in status),
the routers of the space (from the router directory) and the brokers' endpoints (from the broker
directory). Out: one `RouterConfig` per router (same routes, same generation; peers = the other
routers), and for each address the phase it has reached given what each router applied.

Rules:
- anycast and multicast are direct: the routers distribute them, no broker involved;
- queue, topic and subscription are waypoint addresses: the router sends to and reads from the
  broker(s) of their placement, each with its state (Active takes new messages, Draining only hands
  out what it still holds). Without a placement, or while no placed broker has a known endpoint,
  the address stays out of the configuration (a router refuses a waypoint address with no broker)
  and its phase says why;
- a broker the storage-controller says does not hold the address yet (`waiting` in its entry of
  the address's placement) stays out of its route, and with every placed broker waiting the address
  stays out altogether: a router given a broker that lacks the address would attach to it and be
  refused; the route appears once the broker holds it (the status changes, the agent pushes).
  A route the routers already run is kept, though (`SpaceRouting.update`): withdrawing it would
  close its clients' links, and the router re-attaches to the broker by itself;
- a subscription reads a topic: the router wants the topic's AMQP address, the spec names the
  topic's resource, so it is translated here;
- the space plan's quotas become every router's limits (`router_limits`): the space's
  connections and one user's connections split across its routers (ceil(max / routers) each),
  message size and links per connection as they are; a changed plan is a new generation;
- the space's MessagingUsers go to every router as (username, stored scrypt hash, SCRAM keys,
  authorization rules: `enmasse.resources.client_access.endpoint_users`, which the
  storage-controller pushes to a brokered space's broker too), so a router started with
  `--client-auth optional|required` checks SCRAM and PLAIN logins and each logged-in user's
  attaches itself; a user added, removed, given a new password or new rules is a new generation
  like a changed route; the plan's login policy
  (`LoginPolicy`: ANONYMOUS? PLAIN without TLS?) goes with them, and a changed one is a new
  generation too;
- an address is Active only when every router of its space runs a generation that includes its
  current route. `SpaceRouting` remembers, per address, the generation in which its route last
  changed, so a router that applied an older generation holds an address back, and one that
  applied a newer generation counts. A router the agent cannot reach holds back every address
  of its space, whatever it answered before: a phase says what the routers run now, and the
  message names the router (`waiting for router r0: unreachable`).

Everything here is pure (plain values in, plain values out): the agent's loop and its tests share
it without a network.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from enmasse.resources.contracts import (
    ACTIVE,
    CONFIGURING,
    DIRECT_TYPES,
    FAILED,
    PENDING,
    STORED_TYPES,
    TERMINATING,
    max_message_size,
)
from enmasse.resources.discovery import BrokerEndpoint, RouterEndpoint
from enmasse.v1 import resources_pb2, router_pb2

BROKER_NOT_READY = "waiting for broker:"  # held back: every placed broker waits for the address
WAITING_FOR_ROUTER = "waiting for router"
NO_ROUTER = "no router of the space is running"
UNREACHABLE = "unreachable"
AGENT_REASONS = (
    "waiting for a broker placement",
    "no known endpoint yet for broker",
    WAITING_FOR_ROUTER,
    NO_ROUTER,
)
"""Every reason the agent gives starts with one of these (its own messages, told apart from the
storage-controller's when it rewrites a stored address's status)."""


@dataclass(frozen=True)
class Readiness:
    phase: str
    message: str = ""


Placement = Sequence[tuple[str, str]]
"""(broker id, state) pairs of one address, in the order the storage-controller wrote them."""


def placements_of(addresses: Iterable[resources_pb2.Address]) -> dict[str, Placement]:
    """The placement each address carries in its status, by resource name."""
    return {
        a.metadata.name: tuple((b.broker, b.state or ACTIVE) for b in a.status.brokers)
        for a in addresses
        if a.status.brokers
    }


def address_routes(
    *,
    addresses: Sequence[resources_pb2.Address],
    placements: Mapping[str, Placement],
    brokers: Mapping[str, BrokerEndpoint],
) -> tuple[dict[str, router_pb2.AddressRoute], dict[str, str]]:
    """(routes by resource name, why each address left out is left out)."""
    topics = {a.metadata.name: a.spec.address for a in addresses if a.spec.type == "topic"}
    routes: dict[str, router_pb2.AddressRoute] = {}
    held_back: dict[str, str] = {}
    for address in addresses:
        name, spec = address.metadata.name, address.spec
        if address.status.status.phase == TERMINATING:
            continue
        if spec.type in DIRECT_TYPES:
            routes[name] = router_pb2.AddressRoute(address=spec.address, type=spec.type)
            continue
        if spec.type not in STORED_TYPES:
            held_back[name] = f"unknown address type '{spec.type}'"
            continue
        waypoints, why = _waypoints(
            placements.get(name, ()), brokers, waiting=brokers_waiting(address)
        )
        if not waypoints:
            held_back[name] = why
            continue
        route = router_pb2.AddressRoute(address=spec.address, type=spec.type, brokers=waypoints)
        if spec.type == "subscription":
            route.topic = topics.get(spec.topic, spec.topic)
        routes[name] = route
    return routes, held_back


def brokers_waiting(address: resources_pb2.Address) -> frozenset[str]:
    """The brokers the storage-controller says do not hold the address yet."""
    return frozenset(b.broker for b in address.status.brokers if b.waiting)


def _waypoints(
    placement: Placement,
    brokers: Mapping[str, BrokerEndpoint],
    *,
    waiting: frozenset[str] = frozenset(),
) -> tuple[list[router_pb2.BrokerWaypoint], str]:
    if not placement:
        return [], "waiting for a broker placement"
    waypoints = []
    unknown = []
    not_ready = []
    for broker, state in placement:
        endpoint = brokers.get(broker)
        if endpoint is None:
            unknown.append(broker)
            continue
        if state == ACTIVE and broker in waiting:
            not_ready.append(broker)
            continue
        waypoints.append(
            router_pb2.BrokerWaypoint(
                name=broker, host=endpoint.host, port=endpoint.amqp_port, state=state
            )
        )
    if unknown and not waypoints:
        return [], f"no known endpoint yet for broker {', '.join(unknown)}"
    if not_ready and not waypoints:
        return [], f"{BROKER_NOT_READY} {', '.join(not_ready)}"
    return waypoints, ""


def router_config(
    *,
    space: str,
    router_id: str,
    addresses: Sequence[resources_pb2.Address],
    placements: Mapping[str, Placement],
    routers: Sequence[RouterEndpoint],
    brokers: Mapping[str, BrokerEndpoint],
    generation: int,
) -> router_pb2.RouterConfig:
    """The full configuration of router `router_id` of `space` at `generation`."""
    routes, _ = address_routes(addresses=addresses, placements=placements, brokers=brokers)
    return config_for(
        space=space, router_id=router_id, routes=routes, routers=routers, generation=generation
    )


def config_for(
    *,
    space: str,
    router_id: str,
    routes: Mapping[str, router_pb2.AddressRoute],
    routers: Sequence[RouterEndpoint],
    generation: int,
    users: Sequence[router_pb2.RouterUser] = (),
    limits: router_pb2.RouterLimits | None = None,
    logins: LoginPolicy | None = None,
    trace_sampling: float | None = None,
) -> router_pb2.RouterConfig:
    logins = logins or LoginPolicy()
    return router_pb2.RouterConfig(
        generation=generation,
        space=space,
        addresses=[routes[name] for name in sorted(routes)],
        peers=mesh_peers(router_id=router_id, routers=routers),
        users=users,
        limits=limits,
        allow_anonymous=logins.allow_anonymous,
        allow_plain_without_tls=logins.allow_plain_without_tls,
        trace_sampling=trace_sampling,  # None: left unset, the routers' default
    )


def trace_sampling_of(plan: resources_pb2.AddressSpacePlan | None) -> float | None:
    """The share of untraced messages whose trace the space's routers start, as its plan says
    (validated with the plan); None when it says nothing (the routers' default)."""
    if plan is None or not plan.spec.HasField("trace_sampling"):
        return None
    return plan.spec.trace_sampling


@dataclass(frozen=True)
class LoginPolicy:
    """How clients may log in to a space, as its plan says: every router's RouterConfig carries
    it (the routers run `--client-auth required`: SCRAM always, PLAIN over TLS, and these)."""

    allow_anonymous: bool = False
    allow_plain_without_tls: bool = False

    @classmethod
    def of(cls, plan: resources_pb2.AddressSpacePlan | None) -> LoginPolicy:
        """A missing plan allows nothing more."""
        if plan is None:
            return cls()
        spec = plan.spec
        return cls(
            allow_anonymous=spec.allow_anonymous,
            allow_plain_without_tls=spec.allow_plain_without_tls,
        )


def router_limits(quotas: resources_pb2.Quotas, *, routers: int) -> router_pb2.RouterLimits:
    """What each of a space's `routers` enforces of its plan's quotas (0: no limit).

    A space-wide count (the space's connections, one user's connections) is split across the
    routers: each takes ceil(max / routers), so the space holds at most the plan's max plus
    routers - 1, and never 0 (which a router reads as "no limit") while the plan says a number.
    The message size is the plan's, or 100 MiB when it names none (`max_message_size`).
    A router whose share is taken turns clients away even while another has room: clients
    spread over the routers (the space's endpoint balances them). Per-connection and
    per-message limits go to every router as they are."""
    return router_pb2.RouterLimits(
        max_connections=_share(quotas.max_connections, routers=routers),
        max_connections_per_user=_share(quotas.max_connections_per_user, routers=routers),
        max_message_size=max_message_size(quotas.max_message_size),
        max_links_per_connection=quotas.max_links_per_connection,
        max_sessions_per_connection=quotas.max_sessions_per_connection,
    )


def _share(limit: int, *, routers: int) -> int:
    return -(-limit // max(routers, 1)) if limit > 0 else 0


def mesh_peers(*, router_id: str, routers: Sequence[RouterEndpoint]) -> list[router_pb2.MeshPeer]:
    return [
        router_pb2.MeshPeer(
            router_id=r.router_id,
            host=r.host,
            port=r.inter_router_port,
            cost=1,
            amqp_port=r.amqp_port,
            amqps_port=r.amqps_port or 0,
        )
        for r in sorted(routers, key=lambda r: r.router_id)
        if r.router_id != router_id
    ]


def readiness(
    *,
    addresses: Sequence[resources_pb2.Address],
    held_back: Mapping[str, str],
    since: Mapping[str, int],
    applied: Mapping[str, int],
    routers: Sequence[RouterEndpoint],
    unreachable: Collection[str] = (),
) -> dict[str, Readiness]:
    """The phase of every address of a space.

    `since`: address -> the generation in which its current route first appeared; `applied`:
    router id -> the generation that router answered it runs (missing: never applied);
    `unreachable`: the routers the agent cannot reach now, behind whatever they last answered
    (a router that comes back may be a restarted one, running nothing)."""
    found: dict[str, Readiness] = {}
    for address in addresses:
        name = address.metadata.name
        if address.status.status.phase == TERMINATING:
            continue
        if name in held_back:
            found[name] = Readiness(CONFIGURING, held_back[name])
        elif not routers:
            found[name] = Readiness(CONFIGURING, NO_ROUTER)
        else:
            behind = [
                r.router_id
                for r in routers
                if r.router_id in unreachable or applied.get(r.router_id, 0) < since.get(name, 1)
            ]
            found[name] = (
                Readiness(CONFIGURING, waiting_for_routers(behind, unreachable=unreachable))
                if behind
                else Readiness(ACTIVE)
            )
    return found


def space_readiness(
    *,
    generation: int,
    applied: Mapping[str, int],
    routers: Sequence[RouterEndpoint],
    unreachable: Collection[str] = (),
) -> Readiness:
    if not routers:
        return Readiness(PENDING, NO_ROUTER)
    behind = [
        r.router_id
        for r in routers
        if r.router_id in unreachable or applied.get(r.router_id, 0) < generation
    ]
    if behind:
        return Readiness(CONFIGURING, waiting_for_routers(behind, unreachable=unreachable))
    return Readiness(ACTIVE)


def waiting_for_routers(behind: Iterable[str], *, unreachable: Collection[str] = ()) -> str:
    """`waiting for router r0: unreachable, r1`: which routers, and which of them are lost.
    Stable while nothing changes (no error details, no times), so a long outage writes once."""
    named = [f"{r}: {UNREACHABLE}" if r in unreachable else r for r in sorted(behind)]
    return f"{WAITING_FOR_ROUTER} {', '.join(named)}"


def next_generation(previous: int, *, now_ms: int | None = None) -> int:
    """Increasing, and above anything an earlier agent process pushed: wall-clock milliseconds,
    so a restarted agent never offers a router a generation older than the one it runs."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return max(previous + 1, now)


@dataclass
class SpaceRouting:
    """The desired routing of one space and its history: generation, routes, router set.

    `update` takes freshly computed routes and routers; it bumps the generation only when
    something a router would see changed, and remembers per address the generation in which its
    route changed last (for `readiness`)."""

    space: str
    generation: int = 0
    routes: dict[str, router_pb2.AddressRoute] = field(default_factory=dict)
    held_back: dict[str, str] = field(default_factory=dict)
    routers: tuple[RouterEndpoint, ...] = ()
    since: dict[str, int] = field(default_factory=dict)
    users: tuple[router_pb2.RouterUser, ...] = ()
    quotas: resources_pb2.Quotas = field(default_factory=resources_pb2.Quotas)
    logins: LoginPolicy = LoginPolicy()
    trace_sampling: float | None = None

    def update(
        self,
        *,
        routes: Mapping[str, router_pb2.AddressRoute],
        held_back: Mapping[str, str],
        routers: Sequence[RouterEndpoint],
        floor: int = 0,
        now_ms: int | None = None,
        users: Sequence[router_pb2.RouterUser] = (),
        quotas: resources_pb2.Quotas | None = None,
        logins: LoginPolicy | None = None,
        trace_sampling: float | None = None,
    ) -> bool:
        """True when the generation moved (every router must get the new configuration)."""
        self.held_back = dict(held_back)
        # A route the routers already run is not withdrawn because a broker is said to lack the
        # address again: withdrawing would close every client link of it, while the router
        # re-attaches to the broker by itself once the address is back.
        routes = {
            **routes,
            **{
                name: self.routes[name]
                for name, why in held_back.items()
                if why.startswith(BROKER_NOT_READY) and name in self.routes
            },
        }
        ordered = tuple(sorted(routers, key=lambda r: r.router_id))
        peers_changed = _mesh_of(ordered) != _mesh_of(self.routers)
        changed = [name for name, route in routes.items() if self.routes.get(name) != route]
        removed = [name for name in self.routes if name not in routes]
        self.routers = ordered
        users_changed = tuple(users) != self.users
        self.users = tuple(users)
        quotas = quotas if quotas is not None else resources_pb2.Quotas()
        limits_changed = quotas != self.quotas  # (the router count is in peers_changed)
        self.quotas = quotas
        logins = logins or LoginPolicy()
        limits_changed = limits_changed or logins != self.logins  # the plan changed either way
        self.logins = logins
        limits_changed = limits_changed or trace_sampling != self.trace_sampling
        self.trace_sampling = trace_sampling
        # A router running a generation above ours (pushed by an earlier agent) forces a bump.
        moved = changed or removed or peers_changed or users_changed or limits_changed
        if not (moved or floor > self.generation or not self.generation):
            return False
        self.generation = next_generation(max(self.generation, floor), now_ms=now_ms)
        for name in changed:
            self.since[name] = self.generation
        for name in removed:
            self.since.pop(name, None)
        self.routes = dict(routes)
        return True

    def config(self, router_id: str) -> router_pb2.RouterConfig:
        return config_for(
            space=self.space,
            router_id=router_id,
            routes=self.routes,
            routers=self.routers,
            generation=self.generation,
            users=self.users,
            limits=router_limits(self.quotas, routers=len(self.routers)),
            logins=self.logins,
            trace_sampling=self.trace_sampling,
        )


def _mesh_of(routers: Sequence[RouterEndpoint]) -> tuple[tuple[str, str, int], ...]:
    return tuple((r.router_id, r.host, r.inter_router_port) for r in routers)


def status_to_write(
    address: resources_pb2.Address, wanted: Readiness
) -> resources_pb2.AddressStatus | None:
    """The status the agent writes for `address`, or None when it leaves the status alone.

    The division of labour with the storage-controller, which owns stored addresses' placement
    (each broker `waiting` for the address or not) and phase up to Configuring (with messages
    `placed on broker ...`, `waiting for broker: ...` or `broker ready: ...`, for people), and
    Pending/Failed when it cannot place:
    - direct addresses (anycast, multicast) are the agent's alone: phase and message;
    - a stored address nobody has spoken of yet (no placement, no phase) gets the agent's
      Configuring and its reason;
    - a placed stored address whose brokers hold it (none of them `waiting`) is the agent's to
      move between Configuring and Active: Active once every router runs it, back to
      Configuring when one does not any more (lost, restarted), with the agent's reason AFTER
      the storage-controller's messages, which stay. A status the agent lowered keeps its
      reason up to date. The storage-controller leaves such a status as it is (its own
      messages first, its placement unchanged), and the agent never touches a status the
      storage-controller lowered for its own reasons (a broker waiting, Pending, Failed), so
      the two never overwrite each other back and forth.
    """
    current = address.status
    desired = resources_pb2.AddressStatus()
    desired.CopyFrom(current)
    if address.spec.type in DIRECT_TYPES:
        desired.status.phase = wanted.phase
        desired.status.messages[:] = [wanted.message] if wanted.message else []
        desired.status.observed_generation = address.metadata.generation
    elif not current.brokers:
        if current.status.phase:
            return None
        desired.status.phase = wanted.phase
        desired.status.messages[:] = [wanted.message] if wanted.message else []
    else:
        if current.status.phase in (PENDING, FAILED) or any(b.waiting for b in current.brokers):
            return None
        theirs = [m for m in current.status.messages if not m.startswith(AGENT_REASONS)]
        if wanted.phase == ACTIVE:
            if current.status.phase == ACTIVE:
                return None
            desired.status.phase = ACTIVE
            desired.status.messages[:] = theirs
        elif wanted.message.startswith(AGENT_REASONS) and (
            current.status.phase == ACTIVE or lowered_by_agent(current)
        ):
            desired.status.phase = CONFIGURING
            desired.status.messages[:] = [*theirs, wanted.message]
        else:
            return None
    return desired if desired != current else None


def lowered_by_agent(status: resources_pb2.AddressStatus) -> bool:
    """A stored address the agent took back to Configuring (its reason is in the messages)."""
    return status.status.phase == CONFIGURING and any(
        m.startswith(AGENT_REASONS) for m in status.status.messages
    )
