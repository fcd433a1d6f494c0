"""How the router reads an address: configured routes, dynamic reply addresses, the unknown.

In: an address string from an attach (a link's source or target) or from a message's `to` (anonymous
relay), and the running configuration. Out: a `Resolution`: the distribution to apply, and for a
dynamic reply address, the router that owns it; or the precise `amqp:not-found` text.

Dynamic reply addresses are `_dynamic/<router-id>/<n>`: the owner is in the name, so any router of
the mesh routes a reply towards it without waiting for the owner to advertise every reply address.
They live as long as the receiver link the router assigned them to.
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass

from enmasse.resources.contracts import DYNAMIC_PREFIX, SUBSCRIPTION_SEPARATOR
from enmasse.router.config import AddressRoute, Distribution, RouterConfig

DYNAMIC = "dynamic"


@dataclass(frozen=True)
class Resolution:
    address: str
    kind: str  # a Distribution value, or "dynamic"
    route: AddressRoute | None = None
    owner: str = ""  # dynamic: the router that holds the reply receiver

    @property
    def direct(self) -> bool:
        """Routed by the router network itself (no broker)."""
        return self.kind in (Distribution.ANYCAST.value, DYNAMIC)

    @property
    def broker_address(self) -> str:
        """The node on the broker: a subscription lives there as `<topic>::<subscription>`."""
        route = self.route
        if route is not None and route.distribution is Distribution.SUBSCRIPTION:
            return f"{route.topic}{SUBSCRIPTION_SEPARATOR}{self.address}"
        return self.address

    @property
    def refuses_producers(self) -> str | None:
        """Why nobody may send to this address (the amqp:not-allowed text), or None."""
        route = self.route
        if route is not None and route.distribution is Distribution.SUBSCRIPTION:
            return f"address '{self.address}' is a subscription: send to its topic '{route.topic}'"
        return None

    @property
    def multicast(self) -> bool:
        return self.kind == Distribution.MULTICAST.value

    @property
    def waypoint(self) -> bool:
        return self.route is not None and self.route.distribution.is_waypoint


class UnknownAddress(LookupError):
    """The address is not configured in the space; str() is the amqp:not-found description."""


class ReplyAddresses:
    """Allocates this router's dynamic reply addresses; unique across restarts of the router."""

    def __init__(self, router_id: str) -> None:
        self.router_id = router_id
        self._life = secrets.token_hex(4)
        self._counter = itertools.count(1)

    def allocate(self) -> str:
        return f"{DYNAMIC_PREFIX}{self.router_id}/{self._life}.{next(self._counter)}"


def dynamic_owner(address: str) -> str | None:
    """The router id inside a dynamic reply address; None for any other address."""
    if not address.startswith(DYNAMIC_PREFIX):
        return None
    owner, slash, rest = address[len(DYNAMIC_PREFIX) :].partition("/")
    return owner if owner and slash and rest else None


def resolve(address: str, *, config: RouterConfig) -> Resolution:
    """Raises UnknownAddress with the text clients see in amqp:not-found."""
    owner = dynamic_owner(address)
    if owner is not None:
        return Resolution(address=address, kind=DYNAMIC, owner=owner)
    route = config.route(address)
    if route is None:
        space = f" in space '{config.space}'" if config.space else ""
        raise UnknownAddress(f"no address '{address}'{space}")
    return Resolution(address=address, kind=route.distribution.value, route=route)
