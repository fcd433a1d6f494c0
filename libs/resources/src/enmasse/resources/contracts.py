"""The words that cross a service boundary, each written once.

What one service writes and another reads: the phase in a resource's status (the controllers
write it, the CLI and the console read it), the state of a broker in an address's placement (the
storage-controller writes it, the router-agent passes it on, the router obeys it), the address
and address space types (every service branches on them), the separator that names a topic's
subscription queue on a broker (`orders::sub-1`: the router asks for it, the broker holds it,
the subscription service and the storage-controller find it by it), and the address prefixes the
router network and the control plane keep for their own links.

Why plain string constants and not an enum: these strings travel in protobuf fields, YAML
manifests and log lines as they are, and the message hot path (router, broker) formats and
compares them per delivery; an exact `str` imported once at module level costs nothing there,
where an enum member would cost a `__format__` call. Import the names you use
(`from enmasse.resources.contracts import SUBSCRIPTION_SEPARATOR`), never `contracts.X` per
message.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Mapping
from typing import Final

# ------------------------------------------------------------------ phases (Status.phase)

PENDING: Final = "Pending"
"""Declared, not yet being made real (waiting for a broker, a plan, a quota)."""
CONFIGURING: Final = "Configuring"
"""Being made real: brokers created, routers told; not every router has it yet."""
ACTIVE: Final = "Active"
"""Usable: every router of the space routes it (and, stored, its brokers hold it)."""
FAILED: Final = "Failed"
TERMINATING: Final = "Terminating"
PHASES: Final = (PENDING, CONFIGURING, ACTIVE, FAILED, TERMINATING)

# ------------------------------------------------------------------ broker placement states

# An address's BrokerPlacement.state. A broker that takes new messages is ACTIVE (the same word
# as the phase); one that only hands out what it still holds, until its messages have moved to
# the address's new broker, is DRAINING.
DRAINING: Final = "Draining"
PLACEMENT_STATES: Final = (ACTIVE, DRAINING)

# ------------------------------------------------------------------ address types

ANYCAST: Final = "anycast"
MULTICAST: Final = "multicast"
QUEUE: Final = "queue"
TOPIC: Final = "topic"
SUBSCRIPTION: Final = "subscription"
ADDRESS_TYPES: Final = (ANYCAST, MULTICAST, QUEUE, TOPIC, SUBSCRIPTION)
DIRECT_TYPES: Final = frozenset({ANYCAST, MULTICAST})
"""Routed by the router network alone: no broker ever holds them."""
STORED_TYPES: Final = frozenset({QUEUE, TOPIC, SUBSCRIPTION})
"""Held on brokers (store-and-forward): the routers forward them to their broker waypoints."""

# ------------------------------------------------------------------ address space types

STANDARD: Final = "standard"
BROKERED: Final = "brokered"
SPACE_TYPES: Final = (STANDARD, BROKERED)
TYPES_BY_SPACE_TYPE: Final[Mapping[str, tuple[str, ...]]] = {
    STANDARD: ADDRESS_TYPES,
    BROKERED: (QUEUE, TOPIC),  # one broker, JMS-style: no router-only types, no subscriptions
}

# ------------------------------------------------------------------ client endpoints

# The names of an AddressSpace's `status.endpoints`: the router-agent writes a standard space's
# (one pair per router), the storage-controller a brokered space's (its broker's); the CLI and
# clients read them.
AMQP: Final = "amqp"
"""The endpoint over plain TCP (SCRAM logins; PLAIN and ANONYMOUS only where the plan allows)."""
AMQPS: Final = "amqps"
"""The same endpoint over TLS, its certificate naming that router or broker."""
MQTT: Final = "mqtt"
"""A standard space's MQTT gateway (MQTT 3.1.1 and 5 over TCP; logins checked by its routers)."""

# ------------------------------------------------------------------ messaging user operations

OPERATIONS: Final = ("send", "recv", "view", "manage")

# ------------------------------------------------------------------ names on the message plane

SUBSCRIPTION_SEPARATOR: Final = "::"
"""A broker names a topic's subscription queue `<topic>::<subscription>`."""
DYNAMIC_PREFIX: Final = "_dynamic/"
"""Dynamic reply addresses: `_dynamic/<owner>/<life>.<n>`, the router or broker that made it (and
holds its receiver) in the name; see `ReplyAddresses`."""
MESH_PREFIX: Final = "_mesh/"
"""The routers' own links between each other (`_mesh/control`, `_mesh/to/...`, `_mesh/mc/...`)."""
SYSTEM_PREFIX: Final = "$"
"""The control plane's own addresses (the router-agent's probe: `$enmasse/...`)."""
RESERVED_PREFIXES: Final = (DYNAMIC_PREFIX, MESH_PREFIX, SYSTEM_PREFIX)
"""Address prefixes kept for the routers' and the control plane's own links."""

# ------------------------------------------------------------------ the size of one message

DEFAULT_MAX_MESSAGE_SIZE: Final = 100 << 20
"""The largest message (its encoded bytes, headers included) a space takes when its plan names
no `quotas.maxMessageSize`: 100 MiB, as RabbitMQ and ActiveMQ allow. The space's routers
advertise it at attach and refuse a larger delivery for its producer alone (REJECTED with
amqp:link:message-size-exceeded); a brokered space's broker does the same."""
MAX_MESSAGE_SIZE_BOUND: Final = 512 << 20
"""The most a plan may allow (512 MiB, RabbitMQ's ceiling too; a broker's journal takes records
up to 1 GiB). A standard space's broker takes messages up to this size, so it never refuses one
its routers passed, whatever the space's plan says."""


def max_message_size(planned: int) -> int:
    """The limit a space enforces for its plan's `quotas.max_message_size` (0: not set)."""
    return planned if planned > 0 else DEFAULT_MAX_MESSAGE_SIZE


class ReplyAddresses:
    """Allocates one owner's dynamic reply addresses (a router's, a brokered space's broker's):
    `_dynamic/<owner>/<life>.<n>`, unique across restarts of the owner (a new `life` each
    start). The owner is in the name, so a router of the mesh routes a reply towards it
    without waiting for it to advertise every reply address; `dynamic_owner` reads it back."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._life = secrets.token_hex(4)
        self._counter = itertools.count(1)

    def allocate(self) -> str:
        return f"{DYNAMIC_PREFIX}{self.owner}/{self._life}.{next(self._counter)}"


def dynamic_owner(address: str) -> str | None:
    """The owner inside a dynamic reply address; None for any other address."""
    if not address.startswith(DYNAMIC_PREFIX):
        return None
    owner, slash, rest = address[len(DYNAMIC_PREFIX) :].partition("/")
    return owner if owner and slash and rest else None


WILL_ADDRESS = "mqtt/wills"
"""The queue of a standard space that holds its clients' wills (the MQTT gateway's will service
reads and writes it; an AMQP client registers a will by attaching a sender to it and sending
the will, `WILL_CLIENT` naming its container id and `WILL_TARGET` where it goes)."""

WILL_CLIENT, WILL_TARGET = "will_client", "will_address"

LOST_CONNECTIONS = "$lwt"
"""The router's own source of connection notices: a receiver attached to it (by a connection
with full access: the will service) gets one message per ended client connection that had
attached a sender to `WILL_ADDRESS`, with application properties `LOST_CONTAINER` (the
connection's container id) and `LOST_CLEAN` (true: closed without an error, so its will is
dropped; false: lost, so its will is published)."""

LOST_CONTAINER, LOST_CLEAN = "container", "clean"

RETAINED_ADDRESS = "mqtt/retained"
"""The queue of a standard space that holds its retained MQTT messages (the gateway's
`retained.py`), one entry per topic."""

SESSIONS_ADDRESS = "mqtt/sessions"
"""The queue of a standard space that holds its persistent MQTT sessions' records (the
gateway's `persistence.py`)."""

MQTT_STORE_USER = "$mqtt-store"
"""The identity the MQTT gateway logs in to its routers as for its store queues (retained
messages, wills, sessions) and the `$lwt` notices: not a MessagingUser (a MessagingUser may not
take the name); the router-agent adds it to the routers of each space whose plan serves MQTT
(`enmasse.resources.mqtt_stores`)."""
