"""The MQTT gateway's stores in a standard space: the queues it keeps retained messages, wills
and persistent sessions in, and the identity it uses them as.

In: a space plan (does it say `mqtt`?) and the address plans it lists. Out: the store queues a
space of that plan gets (`store_queues`: `mqtt/retained`, `mqtt/wills`, `mqtt/sessions`, as
`dead_letters.NamedQueue`s, so the config service creates them exactly as it creates a space's
`DLQ`: ordinary queues of the space, `managed_by: SPACE_MANAGER`, never pruned), the queue plan
they get (`store_queue_plan`: the space plan's smallest persistent queue plan, since a retained
message must outlive a broker restart), and the router user the gateway logs in as
(`store_identity`).

Why so: the gateway holds nothing a crash could lose, so what must survive lives in queues of
the space; a plan that serves MQTT promises them, so a device gets retained messages, wills and
persistent sessions on a fresh space without anyone declaring a queue. The names are fixed
contracts (`enmasse.resources.contracts`), not the plan's to choose: the router itself knows
`mqtt/wills` (an AMQP client's will) and every gateway of every space finds its stores by them.

The identity: `contracts.MQTT_STORE_USER`, whose rules allow send, recv and view on the store
queues, and send anywhere (a will goes to its client's topic), but no recv or view elsewhere
(the router lets it listen on `$lwt` too, by name: `router/lost_connections.py`). It is no
MessagingUser: the router-agent adds it to the users of every router of a space whose plan
says `mqtt` (`space_users`), from an installation secret it is given
(`--mqtt-store-password-file`); a MessagingUser may not take its username
(`enmasse.resources.validation`), and a tenant's users keep exactly the rules they declare.

Pure: the config service's write path, the rules and the router-agent all call it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from enmasse.common.passwords import hash_password, scram_credentials
from enmasse.resources.authorization import RECV, SEND, VIEW
from enmasse.resources.contracts import (
    MQTT_STORE_USER,
    QUEUE,
    RETAINED_ADDRESS,
    SESSIONS_ADDRESS,
    WILL_ADDRESS,
)
from enmasse.resources.dead_letters import NamedQueue
from enmasse.v1 import resources_pb2, router_pb2

STORE_ADDRESSES = (RETAINED_ADDRESS, WILL_ADDRESS, SESSIONS_ADDRESS)
_ROLES = {
    RETAINED_ADDRESS: "MQTT retained-message store",
    WILL_ADDRESS: "MQTT will store",
    SESSIONS_ADDRESS: "MQTT session store",
}


def serves_mqtt(space_plan: resources_pb2.AddressSpacePlan | None) -> bool:
    """Whether spaces of this plan get the gateway's store queues."""
    return space_plan is not None and space_plan.spec.mqtt


def store_queues(space_plan: resources_pb2.AddressSpacePlan | None) -> dict[str, NamedQueue]:
    """The store queues a space of `space_plan` gets, by address string (none unless it
    serves MQTT)."""
    if not serves_mqtt(space_plan):
        return {}
    assert space_plan is not None
    plan = (space_plan.metadata.name,)
    return {
        address: NamedQueue(address, (_ROLES[address],), plan, owner="address space plan")
        for address in STORE_ADDRESSES
    }


def store_queue_plan(
    space_plan: resources_pb2.AddressSpacePlan | None,
    address_plans: Mapping[str, resources_pb2.AddressPlan],
) -> str | None:
    """The queue plan the store queues get: of the persistent queue plans the space plan lists,
    the one that takes the least of a broker (pooled before dedicated), ties by name; None when
    it lists none."""
    if space_plan is None:
        return None
    persistent = [
        (plan.spec.broker, name)
        for name in space_plan.spec.address_plans
        if (plan := address_plans.get(name)) is not None
        and plan.spec.address_type == QUEUE
        and plan.spec.persistent
    ]
    return min(persistent)[1] if persistent else None


def store_identity(password: str) -> router_pb2.RouterUser:
    """The gateway's store identity as a router checks it: the password's scrypt hash and SCRAM
    keys (made once: a new salt each call); send, recv and view on the store queues, and send
    to any address, since the will service publishes a will on behalf of its client (whose
    right to send to the will's topic was checked when the will was stored). It receives from
    nothing but the store queues (and `$lwt`)."""
    return router_pb2.RouterUser(
        username=MQTT_STORE_USER,
        password_hash=hash_password(password),
        scram_credentials=scram_credentials(password),
        authorization=[
            router_pb2.RouterRule(addresses=list(STORE_ADDRESSES), operations=[SEND, RECV, VIEW]),
            router_pb2.RouterRule(addresses=["#"], operations=[SEND]),
        ],
    )


def space_users(
    users: Sequence[router_pb2.RouterUser],
    *,
    space_plan: resources_pb2.AddressSpacePlan | None,
    identity: router_pb2.RouterUser | None,
) -> tuple[router_pb2.RouterUser, ...]:
    """A space's router users: its MessagingUsers (without one that holds the store identity's
    username, stored before the rules refused it: the name is the gateway's), and the store
    identity when the space's plan serves MQTT and the installation has one."""
    kept = tuple(user for user in users if user.username != MQTT_STORE_USER)
    if identity is None or not serves_mqtt(space_plan):
        return kept
    return (*kept, identity)
