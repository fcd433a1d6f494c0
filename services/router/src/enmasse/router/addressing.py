"""How the router reads an address: configured routes, dynamic reply addresses, the unknown.

In: an address string from an attach (a link's source or target) or from a message's `to` (anonymous
relay), and the running configuration. Out: a `Resolution`: the distribution to apply, and for a
dynamic reply address, the router that owns it; or the precise `amqp:not-found` text.

Dynamic reply addresses are `_dynamic/<router-id>/<life>.<n>` (`contracts.ReplyAddresses`, the
one naming rule a brokered space's broker follows too): the owner is in the name, so any router of
the mesh routes a reply towards it without waiting for the owner to advertise every reply address.
They live as long as the receiver link the router assigned them to.
"""

from __future__ import annotations

from dataclasses import dataclass

from enmasse.resources.contracts import SUBSCRIPTION_SEPARATOR, dynamic_owner
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
