"""Every resource rule of enmasse.resources.validation, with its exact message (pure, no network)."""
# ruff: noqa: E501  (the exact messages read best on one line each)

from __future__ import annotations

import pytest
from enmasse.resources.kinds import kind_of, resource_of
from enmasse.resources.plans import load_default_plans
from enmasse.resources.validation import (
    Catalog,
    Violation,
    validate_batch,
    validate_delete,
    validate_resource,
)
from enmasse.v1 import resources_pb2


def catalog_with(*objects) -> Catalog:
    catalog = Catalog()
    for resource in load_default_plans():
        catalog.put(resource)
    for obj in objects:
        catalog.put(resource_of(obj))
    return catalog


def space(name="shop", *, type_="standard", plan="standard-small"):
    return resources_pb2.AddressSpace(metadata={"name": name}, spec={"type": type_, "plan": plan})


def address(
    name="orders",
    *,
    space_name="shop",
    address_string=None,
    type_="queue",
    plan="standard-small-queue",
    topic="",
):
    return resources_pb2.Address(
        metadata={"name": name, "space": space_name},
        spec={
            "address": name if address_string is None else address_string,
            "type": type_,
            "plan": plan,
            "topic": topic,
        },
    )


def user(name="alice", *, username="alice", password="pw", operations=("send",), addresses=("*",)):
    return resources_pb2.MessagingUser(
        metadata={"name": name, "space": "shop"},
        spec={
            "username": username,
            "password": password,
            "authorization": [{"addresses": list(addresses), "operations": list(operations)}],
        },
    )


def messages(obj, catalog=None) -> list[str]:
    catalog = (
        catalog
        if catalog is not None
        else catalog_with(space(), space("jms", type_="brokered", plan="brokered-single"))
    )
    return [str(v) for v in validate_resource(resource_of(obj), catalog=catalog)]


def test_violation_renders_kind_space_name_field_message() -> None:
    v = Violation("Address", "shop", "orders", "spec.type", "bad")
    assert str(v) == "Address shop/orders: spec.type: bad"
    assert (
        str(Violation("AddressPlan", "", "p", "spec.broker", "bad"))
        == "AddressPlan p: spec.broker: bad"
    )


def test_kind_of() -> None:
    assert kind_of(resource_of(address())) == "Address"
    assert kind_of(space()) == "AddressSpace"


def test_default_plans_are_valid_and_a_valid_address_passes() -> None:
    plans = load_default_plans()
    assert validate_batch(plans, catalog=Catalog()) == [[] for _ in plans]
    assert messages(address()) == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("", "must not be empty"),
        ("a" * 64, "must be at most 63 characters (got 64)"),
        (
            "Orders",
            "'Orders' is not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)",
        ),
        (
            "-orders",
            "'-orders' is not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)",
        ),
        (
            "orders-",
            "'orders-' is not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)",
        ),
        (
            "orders\n",
            "'orders\n' is not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)",
        ),
        (
            "or.ders",
            "'or.ders' is not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)",
        ),
    ],
)
def test_names_are_dns_1123_labels(name: str, expected: str) -> None:
    assert messages(address(name, address_string="x")) == [
        f"Address shop/{name}: metadata.name: {expected}"
    ]


def test_a_63_character_name_is_fine() -> None:
    assert messages(address("a" * 63, address_string="x")) == []


@pytest.mark.parametrize(
    ("address_string", "expected"),
    [
        ("", "must not be empty"),
        ("two words", "'two words' must not contain whitespace"),
        ("tab\there", "'tab\there' must not contain whitespace"),
        ("x" * 256, "must be at most 255 characters (got 256)"),
    ],
)
def test_amqp_address_strings(address_string: str, expected: str) -> None:
    assert messages(address(address_string=address_string)) == [
        f"Address shop/orders: spec.address: {expected}"
    ]


def test_address_string_may_hold_slashes_and_dots() -> None:
    assert messages(address(address_string="orders/eu.west")) == []


def test_address_type_is_one_of_five() -> None:
    assert messages(address(type_="stream")) == [
        "Address shop/orders: spec.type: 'stream' is not an address type "
        "(one of anycast, multicast, queue, topic, subscription)"
    ]


def test_brokered_space_has_only_queues_and_topics() -> None:
    assert messages(address(space_name="jms", type_="anycast", plan="standard-anycast")) == [
        "Address jms/orders: spec.type: type 'anycast' is not allowed in a brokered address space (allowed: queue, topic)",
        "Address jms/orders: spec.plan: address plan 'standard-anycast' is not allowed by address space plan 'brokered-single'",
    ]


def test_plan_must_exist_serve_the_type_and_be_allowed() -> None:
    assert messages(address(plan="gold")) == [
        "Address shop/orders: spec.plan: address plan 'gold' not found"
    ]
    assert messages(address(plan="standard-small-topic")) == [
        "Address shop/orders: spec.plan: address plan 'standard-small-topic' serves type 'topic', not 'queue'"
    ]
    assert messages(address(plan="brokered-queue")) == [
        "Address shop/orders: spec.plan: address plan 'brokered-queue' is not allowed by address space plan 'standard-small'"
    ]
    assert messages(address(plan="")) == [
        "Address shop/orders: spec.plan: must name an address plan"
    ]


def test_subscription_names_an_existing_topic_of_the_same_space() -> None:
    topic = address("news", type_="topic", plan="standard-small-topic")
    other_space_topic = address("alerts", space_name="jms", type_="topic", plan="brokered-topic")
    a_queue = address("work")
    catalog = catalog_with(
        space(),
        space("jms", type_="brokered", plan="brokered-single"),
        topic,
        other_space_topic,
        a_queue,
    )

    def sub(topic_name):
        return address(
            "sub", type_="subscription", plan="standard-small-subscription", topic=topic_name
        )

    assert messages(sub("news"), catalog) == []
    assert messages(sub(""), catalog) == [
        "Address shop/sub: spec.topic: a subscription must name its topic address"
    ]
    assert messages(sub("alerts"), catalog) == [
        "Address shop/sub: spec.topic: topic address 'alerts' not found in address space 'shop'"
    ]
    assert messages(sub("work"), catalog) == [
        "Address shop/sub: spec.topic: address 'work' is of type 'queue', not 'topic'"
    ]
    assert messages(address("q", topic="news"), catalog) == [
        "Address shop/q: spec.topic: only a subscription names a topic"
    ]


def test_one_address_string_once_per_space() -> None:
    catalog = catalog_with(
        space(), space("other"), address("orders"), address("orders", space_name="other")
    )
    assert messages(address("orders-2", address_string="orders"), catalog) == [
        "Address shop/orders-2: spec.address: address 'orders' is already used by address 'orders' in address space 'shop'"
    ]
    assert messages(address("orders"), catalog) == [], (
        "an update of the same object is no duplicate"
    )


def test_space_must_exist_for_address_and_user() -> None:
    lost = address(space_name="nowhere")
    assert messages(lost) == [
        "Address nowhere/orders: metadata.space: address space 'nowhere' not found"
    ]
    assert messages(address(space_name="")) == [
        "Address orders: metadata.space: must name the address space"
    ]
    stray = user()
    stray.metadata.space = "nowhere"
    assert messages(stray) == [
        "MessagingUser nowhere/alice: metadata.space: address space 'nowhere' not found"
    ]


def test_address_space_type_and_plan() -> None:
    assert messages(space("x", type_="premium")) == [
        "AddressSpace x: spec.type: 'premium' is not an address space type (one of standard, brokered)"
    ]
    assert messages(space("x", plan="gold")) == [
        "AddressSpace x: spec.plan: address space plan 'gold' not found"
    ]
    assert messages(space("x", type_="brokered")) == [
        "AddressSpace x: spec.plan: address space plan 'standard-small' is for standard address spaces, not brokered"
    ]
    assert messages(space("x", plan="")) == [
        "AddressSpace x: spec.plan: must name an address space plan"
    ]
    assert messages(space("shop", type_="brokered", plan="brokered-single")) == [
        "AddressSpace shop: spec.type: cannot change from 'standard' to 'brokered'"
    ]
    with_space = resources_pb2.AddressSpace()
    with_space.CopyFrom(space("x"))
    with_space.metadata.space = "y"
    assert messages(with_space) == [
        "AddressSpace x: metadata.space: must be empty: AddressSpace is not space-scoped"
    ]


def test_quota_max_addresses() -> None:
    tiny = resources_pb2.AddressSpacePlan(
        metadata={"name": "tiny"},
        spec={
            "address_space_type": "standard",
            "address_plans": ["standard-small-queue"],
            "quotas": {"max_addresses": 2},
        },
    )
    catalog = catalog_with(
        tiny, space("t", plan="tiny"), address("a", space_name="t"), address("b", space_name="t")
    )
    assert messages(address("c", space_name="t"), catalog) == [
        "Address t/c: metadata.name: address space 't' already has 2 addresses, the most its plan 'tiny' allows"
    ]
    assert messages(address("a", space_name="t", address_string="a2"), catalog) == [], (
        "an update takes no new slot"
    )


def test_quota_max_brokers() -> None:
    two = resources_pb2.AddressSpacePlan(
        metadata={"name": "two"},
        spec={
            "address_space_type": "standard",
            "address_plans": ["standard-large-queue", "standard-xlarge-queue"],
            "quotas": {"max_brokers": 2},
        },
    )
    catalog = catalog_with(
        two, space("t", plan="two"), address("a", space_name="t", plan="standard-large-queue")
    )
    assert messages(address("b", space_name="t", plan="standard-large-queue"), catalog) == []
    assert messages(address("b", space_name="t", plan="standard-xlarge-queue"), catalog) == [
        "Address t/b: spec.plan: the addresses of address space 't' would need 3 brokers, more than the 2 its plan 'two' allows"
    ]


def test_messaging_user_rules() -> None:
    assert messages(user()) == []
    assert messages(user(username="")) == [
        "MessagingUser shop/alice: spec.username: must not be empty"
    ]
    assert messages(user(password="")) == [
        "MessagingUser shop/alice: spec.password: is required when a messaging user is created"
    ]
    assert messages(user(operations=("send", "publish"))) == [
        "MessagingUser shop/alice: spec.authorization[0].operations: 'publish' is not an operation (one of send, recv, view, manage)"
    ]
    assert messages(user(operations=())) == [
        "MessagingUser shop/alice: spec.authorization[0].operations: must name at least one operation"
    ]
    assert messages(user(addresses=())) == [
        "MessagingUser shop/alice: spec.authorization[0].addresses: must name at least one address"
    ]
    stored = user(password="")
    stored.spec.password_hash = "scrypt$..."
    catalog = catalog_with(space(), stored)
    assert messages(user(password=""), catalog) == [], "an update keeps the stored password"
    assert messages(user("bob", username="alice"), catalog) == [
        "MessagingUser shop/bob: spec.username: username 'alice' is already used by messaging user 'alice'"
    ]


def test_address_plan_rules() -> None:
    bad_type = resources_pb2.AddressPlan(
        metadata={"name": "p"}, spec={"address_type": "fifo", "broker": 1}
    )
    assert messages(bad_type) == [
        "AddressPlan p: spec.address_type: 'fifo' is not an address type (one of anycast, multicast, queue, topic, subscription)"
    ]
    no_credit = resources_pb2.AddressPlan(
        metadata={"name": "p"}, spec={"address_type": "queue", "broker": 0}
    )
    assert messages(no_credit) == [
        "AddressPlan p: spec.broker: must be greater than 0 for a queue plan (got 0)"
    ]
    negative = resources_pb2.AddressPlan(
        metadata={"name": "p"}, spec={"address_type": "anycast", "broker": -1}
    )
    assert messages(negative) == ["AddressPlan p: spec.broker: must not be negative (got -1)"]


def test_address_space_plan_rules() -> None:
    plan = resources_pb2.AddressSpacePlan(
        metadata={"name": "p"},
        spec={
            "address_space_type": "brokered",
            "address_plans": ["brokered-queue", "ghost", "standard-anycast"],
        },
    )
    assert messages(plan) == [
        "AddressSpacePlan p: spec.address_plans[1]: address plan 'ghost' not found",
        "AddressSpacePlan p: spec.address_plans[2]: address plan 'standard-anycast' serves 'anycast', which brokered address spaces do not have",
    ]
    wrong = resources_pb2.AddressSpacePlan(
        metadata={"name": "p"}, spec={"address_space_type": "cloud"}
    )
    assert messages(wrong) == [
        "AddressSpacePlan p: spec.address_space_type: 'cloud' is not an address space type (one of standard, brokered)"
    ]


def test_plan_in_use_cannot_be_deleted() -> None:
    catalog = catalog_with(space(), address())
    assert [
        str(v)
        for v in validate_delete(("AddressPlan", "", "standard-small-queue"), catalog=catalog)
    ] == [
        "AddressPlan standard-small-queue: metadata.name: is used by address 'shop/orders'",
        "AddressPlan standard-small-queue: metadata.name: is listed by address space plan 'development'",
        "AddressPlan standard-small-queue: metadata.name: is listed by address space plan 'standard-small'",
    ]
    assert [
        str(v) for v in validate_delete(("AddressSpacePlan", "", "standard-small"), catalog=catalog)
    ] == ["AddressSpacePlan standard-small: metadata.name: is used by address space 'shop'"]
    assert validate_delete(("AddressSpacePlan", "", "brokered-single"), catalog=catalog) == []


def test_batch_objects_count_as_existing() -> None:
    batch = [
        resource_of(
            address("sub", type_="subscription", plan="standard-small-subscription", topic="news")
        ),
        resource_of(address("news", type_="topic", plan="standard-small-topic")),
    ]
    assert validate_batch(batch, catalog=catalog_with(space())) == [[], []]


def test_batch_naming_one_address_twice_is_refused() -> None:
    batch = [
        resource_of(address("a", address_string="dup")),
        resource_of(address("b", address_string="dup")),
    ]
    found = validate_batch(batch, catalog=catalog_with(space()))
    assert [[str(v) for v in vs] for vs in found] == [
        [
            "Address shop/a: spec.address: address 'dup' is declared twice in this batch (also by 'b')"
        ],
        [
            "Address shop/b: spec.address: address 'dup' is declared twice in this batch (also by 'a')"
        ],
    ]


def test_batch_refusal_propagates_to_what_leans_on_it() -> None:
    batch = [
        resource_of(address("news", type_="topic", plan="no-such-plan")),
        resource_of(
            address("sub", type_="subscription", plan="standard-small-subscription", topic="news")
        ),
    ]
    found = validate_batch(batch, catalog=catalog_with(space()))
    assert [str(v) for v in found[0]] == [
        "Address shop/news: spec.plan: address plan 'no-such-plan' not found"
    ]
    assert [str(v) for v in found[1]] == [
        "Address shop/sub: spec.topic: topic address 'news' not found in address space 'shop'"
    ]


def test_batch_quota_accepts_the_first_that_fit() -> None:
    tiny = resources_pb2.AddressSpacePlan(
        metadata={"name": "tiny"},
        spec={
            "address_space_type": "standard",
            "address_plans": ["standard-small-queue"],
            "quotas": {"max_addresses": 2},
        },
    )
    batch = [resource_of(address(n, space_name="t")) for n in ("a", "b", "c")]
    found = validate_batch(batch, catalog=catalog_with(tiny, space("t", plan="tiny")))
    assert [[str(v) for v in vs] for vs in found] == [
        [],
        [],
        [
            "Address t/c: metadata.name: address space 't' already has 2 addresses, the most its plan 'tiny' allows"
        ],
    ]


def test_a_topic_read_by_subscriptions_cannot_be_deleted() -> None:
    topic = address("news", type_="topic", plan="standard-small-topic")
    sub = address("sub", type_="subscription", plan="standard-small-subscription", topic="news")
    catalog = catalog_with(space(), topic, sub)
    assert [str(v) for v in validate_delete(("Address", "shop", "news"), catalog=catalog)] == [
        "Address shop/news: metadata.name: is the topic of subscription 'sub'"
    ]
    assert validate_delete(("Address", "shop", "sub"), catalog=catalog) == []


def test_the_address_index_follows_put_and_remove() -> None:
    catalog = catalog_with(space())
    catalog.address_index()  # built now, kept current from here on
    catalog.put(address("a", address_string="x"))
    catalog.put(address("b", plan="standard-large-queue"))
    catalog.put(address("a", address_string="y"))  # a moves from x to y
    catalog.remove(("Address", "shop", "b"))
    index = catalog.address_index()
    assert index.holders("shop", "x") == set()
    assert index.holders("shop", "y") == {"a"}
    assert index.count_without("shop", "new") == 1
    assert index.credit_without("shop", "new") == pytest.approx(0.01)
    assert messages(address("c", address_string="y"), catalog) == [
        "Address shop/c: spec.address: address 'y' is already used by address 'a' in address space 'shop'"
    ]
    assert messages(address("c", address_string="x"), catalog) == []
