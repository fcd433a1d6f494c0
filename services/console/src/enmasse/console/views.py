"""What the console shows, built from the config service's answers: plain values, no network.

In: the protobuf resources the admin API returns (`AddressSpace`, `Address`, `MessagingUser`,
`AddressSpacePlan`, `AddressPlan`). Out: frozen view models the templates render and the live
stream (live.py) serialises: a space with its endpoints, phase and why; an address with its
phase, why (the status messages), where it is placed and its dead letters; a user with its
rules in one line each; the address plans a space's plan allows, as form choices.

Why plain functions over the API's own messages: the console shows exactly what the API says
(a tenant sees only its spaces because its token only lists those), and every view is tested
without a server. Message rates, stored counts and consumers are not in the admin API: they come
from the routers and brokers (figures.py), beside these views.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from enmasse.v1 import resources_pb2

UNKNOWN_PHASE = "Pending"
"""The phase shown before a controller wrote any status."""


@dataclass(frozen=True)
class EndpointView:
    name: str
    host: str
    port: int

    @property
    def url(self) -> str:
        scheme = self.name if self.name in ("amqp", "amqps", "mqtt", "mqtts") else "amqp"
        return f"{scheme}://{self.host}:{self.port}"


@dataclass(frozen=True)
class SpaceView:
    name: str
    type: str
    plan: str
    phase: str
    why: tuple[str, ...]
    endpoints: tuple[EndpointView, ...]


@dataclass(frozen=True)
class AddressView:
    name: str
    address: str
    type: str
    plan: str
    phase: str
    why: tuple[str, ...]
    brokers: tuple[str, ...]
    """One line per broker placement: `broker-0 Active`, or why the broker does not hold it yet."""
    dead_lettered: int
    dead_letters_held: int
    resource_version: int

    def as_json(self) -> dict[str, Any]:
        fields = asdict(self)
        fields["why"] = list(self.why)
        fields["brokers"] = list(self.brokers)
        return fields


@dataclass(frozen=True)
class UserView:
    name: str
    username: str
    rules: tuple[str, ...]
    """One line per authorization rule: `send, recv: orders/#, invoices`."""


@dataclass(frozen=True)
class PlanChoice:
    name: str
    address_type: str

    @property
    def label(self) -> str:
        return f"{self.name} ({self.address_type})"


def _phase(status: resources_pb2.Status) -> str:
    return status.phase or UNKNOWN_PHASE


def space_view(space: resources_pb2.AddressSpace) -> SpaceView:
    return SpaceView(
        name=space.metadata.name,
        type=space.spec.type,
        plan=space.spec.plan,
        phase=_phase(space.status.status),
        why=tuple(space.status.status.messages),
        endpoints=tuple(
            EndpointView(name=e.name, host=e.host, port=e.port) for e in space.status.endpoints
        ),
    )


def space_views(spaces: Iterable[resources_pb2.AddressSpace]) -> list[SpaceView]:
    return sorted((space_view(s) for s in spaces), key=lambda view: view.name)


def placement_line(placement: resources_pb2.BrokerPlacement) -> str:
    if placement.waiting:
        reason = f": {placement.reason}" if placement.reason else ""
        return f"{placement.broker} waiting{reason}"
    return f"{placement.broker} {placement.state}".strip()


def address_view(address: resources_pb2.Address) -> AddressView:
    status = address.status
    return AddressView(
        name=address.metadata.name,
        address=address.spec.address,
        type=address.spec.type,
        plan=address.spec.plan,
        phase=_phase(status.status),
        why=tuple(status.status.messages),
        brokers=tuple(placement_line(p) for p in status.brokers),
        dead_lettered=status.dead_lettered,
        dead_letters_held=status.dead_letters_held,
        resource_version=address.metadata.resource_version,
    )


def address_views(addresses: Iterable[resources_pb2.Address]) -> list[AddressView]:
    return sorted((address_view(a) for a in addresses), key=lambda view: view.name)


def rule_line(rule: resources_pb2.AuthorizationRule) -> str:
    return f"{', '.join(rule.operations)}: {', '.join(rule.addresses)}"


def user_view(user: resources_pb2.MessagingUser) -> UserView:
    return UserView(
        name=user.metadata.name,
        username=user.spec.username,
        rules=tuple(rule_line(rule) for rule in user.spec.authorization),
    )


def user_views(users: Iterable[resources_pb2.MessagingUser]) -> list[UserView]:
    return sorted((user_view(u) for u in users), key=lambda view: view.name)


def plan_choices(
    *,
    space_plan: resources_pb2.AddressSpacePlan | None,
    address_plans: Iterable[resources_pb2.AddressPlan],
) -> list[PlanChoice]:
    """The address plans an address of this space may use: those its space plan allows, in the
    space plan's order (every plan when the space plan could not be read: the API still
    decides, and says why beside the field)."""
    by_name = {p.metadata.name: p for p in address_plans}
    names = list(space_plan.spec.address_plans) if space_plan is not None else sorted(by_name)
    return [
        PlanChoice(name=name, address_type=by_name[name].spec.address_type)
        for name in names
        if name in by_name
    ]


def address_types(choices: Iterable[PlanChoice]) -> list[str]:
    """The address types the plans serve, each once, in the plans' order."""
    return list(dict.fromkeys(choice.address_type for choice in choices))
