"""The pure part of the subscription service: identities, the broker choice, the record."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from enmasse.resources.discovery import LocalDirectory
from enmasse.subscription.choice import (
    Refusal,
    Subscriber,
    annotation_key,
    choose_broker,
    recorded,
    subscriber_of,
)

THREE = [("broker-0", "Active"), ("broker-1", "Active"), ("broker-2", "Active")]


def test_identity_follows_the_brokers_naming() -> None:
    assert subscriber_of(
        address="prices", container_id="app-7", link_name="sub-a", shared=False
    ) == Subscriber("prices", "app-7|sub-a")
    # JMS shared subscriptions suffix the link name; the container does not matter
    assert subscriber_of(
        address="prices", container_id="any", link_name="audit|global", shared=True
    ) == Subscriber("prices", "audit")
    assert subscriber_of(
        address="prices::audit", container_id="", link_name="", shared=False
    ) == Subscriber("prices", "audit")


@pytest.mark.parametrize(
    ("address", "container_id", "link_name", "shared", "message"),
    [
        ("", "c", "l", False, "address: must not be empty"),
        ("prices::", "c", "l", False, "address 'prices::': expected <topic>::<subscription name>"),
        ("::a", "c", "l", False, "address '::a': expected <topic>::<subscription name>"),
        (
            "prices",
            "c",
            "",
            False,
            "link_name: must not be empty (a durable subscription is named after its link)",
        ),
        (
            "prices",
            "",
            "l",
            False,
            "container_id: must not be empty for a subscription that is not shared",
        ),
    ],
)
def test_unclear_subscribers_are_refused_precisely(
    address: str, container_id: str, link_name: str, shared: bool, message: str
) -> None:
    with pytest.raises(Refusal) as refused:
        subscriber_of(
            address=address, container_id=container_id, link_name=link_name, shared=shared
        )
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.message == message


def test_the_choice_is_stable_and_spreads_subscriptions() -> None:
    identities = [f"app-{i}|sub" for i in range(300)]
    first = {
        i: choose_broker(identity=i, topic="t", placement=THREE, recorded_broker=None)
        for i in identities
    }
    again = {
        i: choose_broker(identity=i, topic="t", placement=THREE[::-1], recorded_broker=None)
        for i in identities
    }
    assert first == again  # placement order does not matter
    counts = {b: list(first.values()).count(b) for b, _ in THREE}
    assert all(count > 50 for count in counts.values()), counts


def test_adding_a_broker_moves_only_the_subscriptions_it_wins() -> None:
    identities = [f"app-{i}|sub" for i in range(300)]
    before = {
        i: choose_broker(identity=i, topic="t", placement=THREE, recorded_broker=None)
        for i in identities
    }
    four = [*THREE, ("broker-3", "Active")]
    after = {
        i: choose_broker(identity=i, topic="t", placement=four, recorded_broker=None)
        for i in identities
    }
    moved = [i for i in identities if before[i] != after[i]]
    assert moved
    assert all(after[i] == "broker-3" for i in moved)


def test_a_recorded_choice_wins_while_the_topic_is_still_on_that_broker() -> None:
    draining = [("broker-0", "Draining"), ("broker-1", "Active")]
    assert (
        choose_broker(identity="a|b", topic="t", placement=draining, recorded_broker="broker-0")
        == "broker-0"
    )
    # the recorded broker no longer holds the topic: choose again among the Active ones
    assert (
        choose_broker(identity="a|b", topic="t", placement=draining, recorded_broker="broker-9")
        == "broker-1"
    )


def test_a_topic_without_an_active_broker_is_refused() -> None:
    with pytest.raises(Refusal) as refused:
        choose_broker(
            identity="a|b",
            topic="prices",
            placement=[("broker-0", "Draining")],
            recorded_broker=None,
        )
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.message == "topic 'prices' is not placed on an Active broker yet"


def test_records_live_in_annotations_of_their_own_prefix() -> None:
    annotations = {
        annotation_key("app-1|sub"): "broker-0",
        annotation_key("audit"): "broker-1",
        "owner": "team-a",
    }
    assert recorded(annotations) == {"app-1|sub": "broker-0", "audit": "broker-1"}


def test_a_broker_is_found_by_its_ports_file(tmp_path: Path) -> None:
    brokers = LocalDirectory(tmp_path / "var", brokers=tmp_path)
    assert brokers.broker("shop", "broker-0") is None
    (tmp_path / "shop/broker-0").mkdir(parents=True)
    (tmp_path / "shop/broker-0/ports.json").write_text('{"amqp": 1, "ad')  # torn
    assert brokers.broker("shop", "broker-0") is None
    (tmp_path / "shop/broker-0/ports.json").write_text('{"amqp": 1, "admin": 2, "pid": 3}')
    found = brokers.broker("shop", "broker-0")
    assert found is not None
    assert (found.name, found.amqp_port, found.admin) == ("broker-0", 1, "127.0.0.1:2")
