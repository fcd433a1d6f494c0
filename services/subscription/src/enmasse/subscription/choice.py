"""Which broker holds a durable subscription: names, the choice, and how it is recorded.

In: a subscriber's request (space, the address it attached to, its container id and link name,
whether the link is shared), the topic Address (its placement over brokers and the choices
already recorded on it). Out: the subscription's identity, the broker that holds it, and the
annotations that record the choice; or a `Refusal` with the gRPC code and the exact message.

Why it is built so:
- identity follows the broker (enmasse.broker.topic.durable_identity): `container-id|link-name`,
  or the link name up to the first `|` for shared subscriptions (JMS suffixes). An address of the
  form `<topic>::<name>` names a shared subscription `<name>` of `<topic>` outright.
- the choice is rendezvous hashing (highest random weight) of the identity over the topic's
  Active brokers: every instance of the service (and a restarted one) computes the same broker
  without talking to anybody, and adding a broker moves only the subscriptions that now hash to
  it. Once recorded, the recorded broker wins for as long as the topic is still placed on it
  (Active or Draining): a subscription with messages waiting must not move because the broker
  set changed.
- a `subscription` Address (type subscription, reading topic T) is a shared durable
  subscription named after its address, `T::<address>` on the broker: the service creates it
  there as soon as the address is placed, so it keeps what T publishes from then on, before any
  consumer came.
- the record is an annotation on the topic Address, `subscription.enmasse.io/<identity>:
  <broker>`, written through the config service (so it lives in etcd with the topic and goes
  away with it). A GitOps re-apply that drops annotations loses only the record, not the
  choice: hashing gives the same broker back while the broker set is unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc
from enmasse.resources.contracts import ACTIVE, SUBSCRIPTION_SEPARATOR

ANNOTATION_PREFIX = "subscription.enmasse.io/"


class Refusal(Exception):
    """A look-up the service refuses: the gRPC status and the message the caller sees."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Subscriber:
    """Who asks: the topic's AMQP address and the subscription's identity."""

    topic: str
    identity: str


def subscriber_of(*, address: str, container_id: str, link_name: str, shared: bool) -> Subscriber:
    """The topic and identity a durable receiver means; Refusal(INVALID_ARGUMENT) when unclear."""
    if not address:
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "address: must not be empty")
    if SUBSCRIPTION_SEPARATOR in address:
        topic, _, name = address.partition(SUBSCRIPTION_SEPARATOR)
        if not topic or not name or SUBSCRIPTION_SEPARATOR in name:
            raise Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"address '{address}': expected <topic>::<subscription name>",
            )
        return Subscriber(topic=topic, identity=name)
    if not link_name:
        raise Refusal(
            grpc.StatusCode.INVALID_ARGUMENT,
            "link_name: must not be empty (a durable subscription is named after its link)",
        )
    if shared:
        return Subscriber(topic=address, identity=link_name.split("|", 1)[0])
    if not container_id:
        raise Refusal(
            grpc.StatusCode.INVALID_ARGUMENT,
            "container_id: must not be empty for a subscription that is not shared",
        )
    return Subscriber(topic=address, identity=f"{container_id}|{link_name}")


def recorded(annotations: Mapping[str, str]) -> dict[str, str]:
    """identity -> broker, as recorded on a topic Address."""
    return {
        key[len(ANNOTATION_PREFIX) :]: broker
        for key, broker in annotations.items()
        if key.startswith(ANNOTATION_PREFIX) and key != ANNOTATION_PREFIX
    }


def annotation_key(identity: str) -> str:
    return ANNOTATION_PREFIX + identity


def weight(identity: str, broker: str) -> bytes:
    return hashlib.sha256(f"{identity}\0{broker}".encode()).digest()


def choose_broker(
    *, identity: str, topic: str, placement: Sequence[tuple[str, str]], recorded_broker: str | None
) -> str:
    """The broker that holds `identity` among the topic's placement ((broker, state) pairs)."""
    placed = {broker for broker, _state in placement}
    if recorded_broker is not None and recorded_broker in placed:
        return recorded_broker
    active = [broker for broker, state in placement if (state or ACTIVE) == ACTIVE]
    if not active:
        raise Refusal(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"topic '{topic}' is not placed on an Active broker yet",
        )
    return max(active, key=lambda broker: weight(identity, broker))


def subscription_queue(*, topic: str, name: str) -> str:
    """The broker node of the subscription `name` of `topic` (what routers attach to)."""
    return f"{topic}{SUBSCRIPTION_SEPARATOR}{name}"


def subscription_address_broker(
    *,
    name: str,
    topic: str,
    own: Sequence[tuple[str, str]],
    topic_placement: Sequence[tuple[str, str]],
) -> str:
    """The broker that holds a `subscription` address: its own placement (the storage-
    controller's) when it has one, else a choice among its topic's brokers, as for any
    durable subscription named `name`."""
    return choose_broker(
        identity=name, topic=topic, placement=own or topic_placement, recorded_broker=None
    )
