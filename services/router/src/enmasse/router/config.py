"""The router's configuration: what RouterAdmin applies, as plain immutable values.

In flows a `router_pb2.RouterConfig` (pushed by the router-agent, or by a test); out comes a
`RouterConfig` that the router swaps in whole, or a `ConfigError` whose text names the address (or
peer, or user) and the rule it broke. The users (username -> scrypt hash, and their SCRAM keys)
and the space's login policy (anonymous? PLAIN without TLS?) are what the client listener checks
logins against (`enmasse.amqp.logins.UserLogins`); the hashes and keys never leave the router
again: `config_to_proto` (GetConfig) gives the names and rules only. Each user's authorization
rules (validated by `enmasse.resources.client_access`, as a brokered space's broker validates
the same users, with the `pattern_problem` the config service validates with) are what
`forwarding.Router` checks that user's links against. Nothing
is half-applied: a configuration either validates as a whole or is refused, and the router keeps
running the one it had.

Why a separate model and not the protobuf message itself: the forwarding code asks questions
("is this a waypoint address?", "which brokers are Active for it?") many times per second; answering
them from frozen dataclasses and dicts built once per apply is cheap and keeps the hot path free of
protobuf accessors. The generation rule (same generation: no-op; older: refused) lives in
`decide_apply` so it can be tested without a process.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from enmasse.common import tracing
from enmasse.common.passwords import ScramKeys
from enmasse.resources import contracts
from enmasse.resources.authorization import Rule
from enmasse.resources.client_access import UserError, client_users_from_proto
from enmasse.v1 import router_pb2


class ConfigError(ValueError):
    """A configuration that does not hold together; the message names the culprit."""


class StaleGeneration(ValueError):
    """A configuration older than the one running."""


class Distribution(enum.Enum):
    ANYCAST = "anycast"
    MULTICAST = "multicast"
    QUEUE = "queue"
    TOPIC = "topic"
    SUBSCRIPTION = "subscription"

    @property
    def is_waypoint(self) -> bool:
        return self in (Distribution.QUEUE, Distribution.TOPIC, Distribution.SUBSCRIPTION)


class BrokerState(enum.Enum):
    ACTIVE = contracts.ACTIVE
    DRAINING = contracts.DRAINING


@dataclass(frozen=True)
class Waypoint:
    broker: str
    host: str
    port: int
    state: BrokerState = BrokerState.ACTIVE


@dataclass(frozen=True)
class AddressRoute:
    address: str
    distribution: Distribution
    waypoints: tuple[Waypoint, ...] = ()
    topic: str = ""

    @property
    def active_waypoints(self) -> tuple[Waypoint, ...]:
        """Brokers that take new messages; draining ones only hand out what they still hold."""
        return tuple(w for w in self.waypoints if w.state is BrokerState.ACTIVE)


@dataclass(frozen=True)
class MeshPeer:
    router_id: str
    host: str
    port: int
    cost: int = 1
    amqp_port: int = 0  # where it serves clients on `host` (0: unknown): redirects go there
    amqps_port: int = 0


@dataclass(frozen=True)
class Limits:
    max_message_size: int = 0
    max_connections: int = 0
    max_links_per_connection: int = 0
    idle_timeout_ms: int = 0
    max_connections_per_user: int = 0
    max_sessions_per_connection: int = 0


@dataclass(frozen=True)
class RouterConfig:
    generation: int = 0
    space: str = ""
    addresses: dict[str, AddressRoute] = field(default_factory=dict)
    peers: tuple[MeshPeer, ...] = ()
    limits: Limits = Limits()
    users: dict[str, str] = field(default_factory=dict)  # username -> stored password hash
    rules: dict[str, tuple[Rule, ...]] = field(default_factory=dict)  # username -> its rules
    # username -> mechanism -> its SCRAM keys (SCRAM logins; secret like the hashes)
    scram: dict[str, dict[str, ScramKeys]] = field(default_factory=dict)
    # How clients may log in under `--client-auth required` (the space plan's say).
    allow_anonymous: bool = False
    allow_plain_without_tls: bool = False
    # The share of untraced messages whose trace this router starts (0: none; `hops.py`).
    trace_sampling: float = tracing.ROUTER_SAMPLING_DEFAULT

    def route(self, address: str) -> AddressRoute | None:
        return self.addresses.get(address)

    def peers_to_dial(self, *, router_id: str) -> tuple[MeshPeer, ...]:
        """Each pair of routers connects once: the greater router_id dials the smaller."""
        return tuple(p for p in self.peers if p.router_id < router_id)

    def brokers(self) -> dict[str, Waypoint]:
        """Every broker named by any address, by name (its Active/Draining state aside)."""
        found: dict[str, Waypoint] = {}
        for route in self.addresses.values():
            for waypoint in route.waypoints:
                found.setdefault(waypoint.broker, waypoint)
        return found


def config_from_proto(message: router_pb2.RouterConfig, *, router_id: str) -> RouterConfig:
    """Validates a pushed configuration as a whole; raises ConfigError naming what is wrong."""
    if message.generation <= 0:
        raise ConfigError(f"generation must be > 0, got {message.generation}")
    addresses: dict[str, AddressRoute] = {}
    for entry in message.addresses:
        route = _route_from_proto(entry)
        if route.address in addresses:
            raise ConfigError(f"address '{route.address}' is configured twice")
        addresses[route.address] = route
    for route in addresses.values():
        if route.distribution is Distribution.SUBSCRIPTION and route.topic:
            topic = addresses.get(route.topic)
            if topic is not None and topic.distribution is not Distribution.TOPIC:
                raise ConfigError(
                    f"subscription '{route.address}' reads '{route.topic}', which is a "
                    f"{topic.distribution.value}, not a topic"
                )
    peers = _peers_from_proto(message.peers, router_id=router_id)
    limits = _limits_from_proto(message.limits)
    sampling = _sampling_from_proto(message)
    try:
        clients = client_users_from_proto(message.users)
    except UserError as error:
        raise ConfigError(str(error)) from None
    return RouterConfig(
        generation=message.generation,
        space=message.space,
        addresses=addresses,
        peers=peers,
        limits=limits,
        users=clients.hashes,
        rules=clients.rules,
        scram=clients.scram,
        allow_anonymous=message.allow_anonymous,
        allow_plain_without_tls=message.allow_plain_without_tls,
        trace_sampling=sampling,
    )


def _sampling_from_proto(message: router_pb2.RouterConfig) -> float:
    if not message.HasField("trace_sampling"):
        return tracing.ROUTER_SAMPLING_DEFAULT
    problem = tracing.router_sampling_problem(message.trace_sampling)
    if problem:
        raise ConfigError(f"trace sampling {problem}")
    return message.trace_sampling


def config_to_proto(config: RouterConfig) -> router_pb2.RouterConfig:
    return router_pb2.RouterConfig(
        generation=config.generation,
        space=config.space,
        addresses=[
            router_pb2.AddressRoute(
                address=r.address,
                type=r.distribution.value,
                topic=r.topic,
                brokers=[
                    router_pb2.BrokerWaypoint(
                        name=w.broker, host=w.host, port=w.port, state=w.state.value
                    )
                    for w in r.waypoints
                ],
            )
            for r in config.addresses.values()
        ],
        peers=[
            router_pb2.MeshPeer(
                router_id=p.router_id,
                host=p.host,
                port=p.port,
                cost=p.cost,
                amqp_port=p.amqp_port,
                amqps_port=p.amqps_port,
            )
            for p in config.peers
        ],
        limits=router_pb2.RouterLimits(
            max_message_size=config.limits.max_message_size,
            max_connections=config.limits.max_connections,
            max_links_per_connection=config.limits.max_links_per_connection,
            idle_timeout_ms=config.limits.idle_timeout_ms,
            max_connections_per_user=config.limits.max_connections_per_user,
            max_sessions_per_connection=config.limits.max_sessions_per_connection,
        ),
        # Hashes stay inside the router: an admin reading the config learns who, not how.
        users=[
            router_pb2.RouterUser(
                username=name,
                authorization=[
                    router_pb2.RouterRule(
                        addresses=rule.addresses, operations=sorted(rule.operations)
                    )
                    for rule in config.rules.get(name, ())
                ],
            )
            for name in config.users
        ],
        allow_anonymous=config.allow_anonymous,
        allow_plain_without_tls=config.allow_plain_without_tls,
        trace_sampling=config.trace_sampling,
    )


def decide_apply(*, running: RouterConfig, pushed_generation: int) -> bool:
    """True when the pushed configuration must be swapped in; False when it already runs.

    Raises StaleGeneration for an older generation: a late push from a restarted agent must not
    roll the router back.
    """
    if pushed_generation == running.generation:
        return False
    if pushed_generation < running.generation:
        raise StaleGeneration(
            f"generation {pushed_generation} is older than the running generation "
            f"{running.generation}"
        )
    return True


def _route_from_proto(entry: router_pb2.AddressRoute) -> AddressRoute:
    if not entry.address:
        raise ConfigError("an address entry has an empty address")
    try:
        distribution = Distribution(entry.type)
    except ValueError:
        kinds = ", ".join(d.value for d in Distribution)
        raise ConfigError(
            f"address '{entry.address}' has unknown type '{entry.type}' (expected one of {kinds})"
        ) from None
    waypoints = tuple(_waypoint_from_proto(entry.address, b) for b in entry.brokers)
    if distribution.is_waypoint and not waypoints:
        raise ConfigError(
            f"address '{entry.address}' of type {distribution.value} needs at least one broker"
        )
    if not distribution.is_waypoint and waypoints:
        raise ConfigError(
            f"address '{entry.address}' of type {distribution.value} is direct and takes no brokers"
        )
    names = [w.broker for w in waypoints]
    if len(set(names)) != len(names):
        raise ConfigError(f"address '{entry.address}' names a broker twice")
    if distribution is Distribution.SUBSCRIPTION and not entry.topic:
        raise ConfigError(f"subscription '{entry.address}' needs a topic")
    return AddressRoute(
        address=entry.address, distribution=distribution, waypoints=waypoints, topic=entry.topic
    )


def _waypoint_from_proto(address: str, broker: router_pb2.BrokerWaypoint) -> Waypoint:
    if not broker.name:
        raise ConfigError(f"address '{address}' has a broker without a name")
    if not broker.host or not 0 < broker.port < 65536:
        raise ConfigError(
            f"address '{address}': broker '{broker.name}' needs a host and a port in 1..65535"
        )
    try:
        state = BrokerState(broker.state or BrokerState.ACTIVE.value)
    except ValueError:
        raise ConfigError(
            f"address '{address}': broker '{broker.name}' has unknown state '{broker.state}' "
            "(expected Active or Draining)"
        ) from None
    return Waypoint(broker=broker.name, host=broker.host, port=broker.port, state=state)


def _peers_from_proto(
    peers: Iterable[router_pb2.MeshPeer], *, router_id: str
) -> tuple[MeshPeer, ...]:
    found: dict[str, MeshPeer] = {}
    for peer in peers:
        if not peer.router_id:
            raise ConfigError("a mesh peer has an empty router_id")
        if peer.router_id == router_id:
            continue  # the agent may list the whole mesh, this router included
        if peer.router_id in found:
            raise ConfigError(f"mesh peer '{peer.router_id}' is listed twice")
        if not peer.host or not 0 < peer.port < 65536:
            raise ConfigError(f"mesh peer '{peer.router_id}' needs a host and a port in 1..65535")
        if peer.cost < 0:
            raise ConfigError(f"mesh peer '{peer.router_id}' has negative cost {peer.cost}")
        for client_port in (peer.amqp_port, peer.amqps_port):
            if not 0 <= client_port < 65536:
                raise ConfigError(
                    f"mesh peer '{peer.router_id}' has client port {client_port}, not in 0..65535"
                )
        found[peer.router_id] = MeshPeer(
            router_id=peer.router_id,
            host=peer.host,
            port=peer.port,
            cost=peer.cost or 1,
            amqp_port=peer.amqp_port,
            amqps_port=peer.amqps_port,
        )
    return tuple(found.values())


def _limits_from_proto(limits: router_pb2.RouterLimits) -> Limits:
    for name in (
        "max_message_size",
        "max_connections",
        "max_links_per_connection",
        "max_connections_per_user",
        "max_sessions_per_connection",
    ):
        if getattr(limits, name) < 0:
            raise ConfigError(f"limit {name} must be >= 0, got {getattr(limits, name)}")
    if limits.idle_timeout_ms < 0:
        raise ConfigError(f"limit idle_timeout_ms must be >= 0, got {limits.idle_timeout_ms}")
    return Limits(
        max_message_size=limits.max_message_size,
        max_connections=limits.max_connections,
        max_links_per_connection=limits.max_links_per_connection,
        idle_timeout_ms=limits.idle_timeout_ms,
        max_connections_per_user=limits.max_connections_per_user,
        max_sessions_per_connection=limits.max_sessions_per_connection,
    )
