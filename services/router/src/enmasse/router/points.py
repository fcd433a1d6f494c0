"""What the router keeps per address and per link: the state its three parts share.

`AddressPoint`: one address as this router serves it (local consumers, the targets a delivery may
go to, producers, deliveries waiting for credit, counters; for a dynamic reply address, the
connection it belongs to). `LinkState`: what one link is to the router (its `Role`, its address
point, and per role a few fields), kept in `link.context` so that every engine event finds it
without a lookup. `ConnectionRecord`: a connection's id and counters, in `connection.context`,
with what the connection's user may do (`enmasse.resources.permissions.Permissions`). The names
of the router's own inter-router nodes live here too.

Plain data: the forwarding core (`forwarding`), the mesh side (`inter_router`) and the broker
side (`waypoints`) read and change it; nothing here does I/O.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from dataclasses import dataclass, field

from enmasse.amqp.engine import Connection, Delivery, Link
from enmasse.resources.contracts import MESH_PREFIX
from enmasse.resources.permissions import UNRESTRICTED, Permissions
from enmasse.router.addressing import Resolution
from enmasse.router.balancing import Balancer
from enmasse.router.config import Distribution
from enmasse.router.fanout import CopyQueue
from enmasse.router.stats import AddressCounters

# Credit a producer holds (topped up by half-windows as its deliveries move on). 250 starved a
# pre-settled producer while the router worked through a batch of its messages (bench: 105,000
# msgs/s against 135,000 at 1,000); 1,000 is the broker's window too. What waits for a consumer's
# credit is bounded by the producers' windows.
PRODUCER_WINDOW = 1000
# Credit a neighbour holds on an inter-router link (one per address and destination router,
# shared by all the producers behind it), given back in quarter windows as deliveries move on,
# and held back while they wait here for a consumer (or, passing through, for the link onward):
# so what a stalled consumer makes wait is bounded hop by hop back to the producers. 1,000 left a
# two-router chain at 0.6 of one router (four busy processes on two cores: each hop must buffer
# across the others' time slices); 4,000 gave 0.7-0.9 (bench/RESULTS.md, session 5).
TRANSIT_WINDOW = 4000
# What one sender's window may hold in bytes, once its message sizes are known (`windows.py`):
# 1,000 messages up to 16 kB each, 4,000 up to 16 kB on a transit link; larger ones get fewer.
PRODUCER_BYTES = 16 * 1024 * 1024
TRANSIT_BYTES = 64 * 1024 * 1024
CONTROL_WINDOW = 1000
REDIAL_SECONDS = (0.1, 0.25, 0.5, 1.0)
# The condition of a connection whose socket failed (peer down, connection reset): not a refusal.
UNREACHABLE = "proton:io"
SWEEP_SECONDS = 30.0

MESH_CONTROL = f"{MESH_PREFIX}control"
MESH_TO = f"{MESH_PREFIX}to/"
MESH_MULTICAST = f"{MESH_PREFIX}mc/"

ANYCAST = Distribution.ANYCAST.value
MULTICAST = Distribution.MULTICAST.value


class Role(enum.Enum):
    PRODUCER = "producer"  # a client sends to us
    CONSUMER = "consumer"  # we send to a client
    TRANSIT_IN = "transit-in"  # a neighbour router sends anycast deliveries to us
    TRANSIT_OUT = "transit-out"  # we send anycast deliveries to a neighbour
    MULTICAST_IN = "multicast-in"
    MULTICAST_OUT = "multicast-out"
    CONTROL_IN = "control-in"
    CONTROL_OUT = "control-out"
    BROKER_OUT = "broker-out"  # we send a waypoint address's deliveries to a broker
    BROKER_IN = "broker-in"  # a broker sends us deliveries for one client consumer
    REVOKED = "revoked"  # a client link that lost its right: closed, out of its address point
    PATTERN = "pattern"  # we tell a client which addresses its pattern matches (`patterns.py`)


# The roles by module name, for the per-message paths: Python 3.11 looks an enum member up
# through EnumType.__getattr__, about 100 ns a time; a module global costs about 10.
PRODUCER, CONSUMER = Role.PRODUCER, Role.CONSUMER
TRANSIT_IN, TRANSIT_OUT = Role.TRANSIT_IN, Role.TRANSIT_OUT
MULTICAST_IN, MULTICAST_OUT = Role.MULTICAST_IN, Role.MULTICAST_OUT
CONTROL_IN, CONTROL_OUT = Role.CONTROL_IN, Role.CONTROL_OUT
BROKER_OUT, BROKER_IN = Role.BROKER_OUT, Role.BROKER_IN
REVOKED = Role.REVOKED
PATTERN = Role.PATTERN


class ConnectionRole(enum.Enum):
    NORMAL = "normal"
    INTER_ROUTER = "inter-router"
    BROKER = "broker"


@dataclass(eq=False)
class AddressPoint:
    """One address as this router serves it."""

    address: str
    kind: str
    resolution: Resolution
    local: list[Link] = field(default_factory=list)
    targets: Balancer[Link] = field(default_factory=Balancer)
    remote: dict[str, Link] = field(default_factory=dict)  # anycast: router -> link towards it
    producers: list[Link] = field(default_factory=list)
    transit_in: list[Link] = field(default_factory=list)  # neighbours' links that end here
    anonymous_owed: list[Link] = field(default_factory=list)  # a credit each, once nothing waits
    pending: deque[Delivery] = field(default_factory=deque)
    counters: AddressCounters = field(default_factory=AddressCounters)
    multicast_hops: dict[str, list[str]] = field(default_factory=dict)  # origin -> neighbours
    seen_at_sweep: int = -1  # deliveries_in at the last housekeeping sweep
    creator: ConnectionRecord | None = None  # dynamic: the connection that asked for it

    @property
    def waypoint(self) -> bool:
        return self.resolution.waypoint


@dataclass(eq=False)
class LinkState:
    role: Role
    point: AddressPoint | None = None
    router: str = ""  # transit: destination router; multicast: origin; control: the neighbour
    consumer: Link | None = None  # broker-in: the client consumer it feeds
    feeds: list[Link] = field(default_factory=list)  # waypoint consumer: its broker receivers
    held: deque[Delivery] = field(default_factory=deque)  # waypoint consumer: awaiting credit
    draining: set[Link] = field(default_factory=set)  # waypoint consumer: feeds yet to drain
    copies: CopyQueue[bytes] | None = None  # multicast out
    durable: bool = False  # waypoint consumer: detach (not close) its broker links on the way out
    deliveries: int = 0
    unflowed: int = 0  # producer, transit in: deliveries taken since credit was last given back
    unflowed_bytes: int = 0  # ... and what they weighed
    window: int = 0  # producer, transit in: the credit it holds when topped up (`windows.py`)
    held_back: list[Link] = field(default_factory=list)  # transit out: transit in awaiting credit
    # Anonymous producer whose user may not send everywhere: `to` -> allowed (None: no check).
    sends: dict[str, bool] | None = None


@dataclass(eq=False)
class ConnectionRecord:
    id: int
    role: ConnectionRole
    connection: Connection
    deliveries_in: int = 0
    deliveries_out: int = 0
    permissions: Permissions = UNRESTRICTED  # client connections: what its user may do
    opened_at: float = field(default_factory=time.time)  # wall clock: shown as "open since"


def mesh_target(address: str) -> tuple[str, str]:
    """`_mesh/to/<router>/<address>` or `_mesh/mc/<router>/<address>` -> (router, address)."""
    for prefix in (MESH_TO, MESH_MULTICAST):
        if address.startswith(prefix):
            router, _, target = address[len(prefix) :].partition("/")
            return router, target
    return "", ""
