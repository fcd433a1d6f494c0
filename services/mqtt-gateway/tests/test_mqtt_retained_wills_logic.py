"""The pure logic of retained messages and wills (no network): what the gateway writes to its
store queues and reads back, which entries a selector asks the broker for, which retained
messages a subscription gets and with which flags, and when a will is dropped or published.
The same code runs against real brokers in tests/test_mqtt_retained_will.py."""

from __future__ import annotations

import pytest
from enmasse.amqp import codec
from enmasse.amqp.selector import compile_selector
from enmasse.mqtt_gateway import mapping, retained, wills
from enmasse.mqtt_gateway.packets import CONTENT_TYPE, USER_PROPERTY, Publish, Will
from enmasse.resources.contracts import LOST_CLEAN, LOST_CONTAINER


def _entry(topic: str, payload: bytes, *, stamp: int, qos: int = 1) -> retained.Retained:
    publish = Publish(topic=topic, payload=payload, qos=qos, retain=True)
    read = retained.retained_of(retained.entry_of(publish, topic=topic, stamp=stamp))
    assert read is not None
    return read


# -- retained messages --


def test_a_retained_entry_reads_back_with_its_topic_qos_and_properties() -> None:
    publish = Publish(
        topic="status/lamp",
        payload=b"on",
        qos=2,
        retain=True,
        properties={CONTENT_TYPE: "text/plain", USER_PROPERTY: [("room", "hall")]},
    )
    entry = retained.retained_of(retained.entry_of(publish, topic="status/lamp", stamp=42))
    assert entry == retained.Retained(
        topic="status/lamp",
        payload=b"on",
        qos=2,
        stamp=42,
        properties={USER_PROPERTY: [("room", "hall")], CONTENT_TYPE: "text/plain"},
    )


def test_a_message_that_is_not_a_retained_entry_is_ignored() -> None:
    assert retained.retained_of(codec.encode_message(b"x")) is None


def test_newest_keeps_the_latest_stamp_per_topic_and_drops_cleared_topics() -> None:
    entries = [
        _entry("a", b"old", stamp=1),
        _entry("a", b"new", stamp=3),
        _entry("b", b"only", stamp=2),
        _entry("c", b"was", stamp=1),
        _entry("c", b"", stamp=2),  # an empty value not yet taken off: cleared
    ]
    assert [(e.topic, e.payload) for e in retained.newest(entries)] == [
        ("a", b"new"),
        ("b", b"only"),
    ]


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("status/lamp", "status/lamp", True),
        ("status/lamp", "status/lamps", False),
        ("status/+", "status/lamp", True),
        ("status/+", "status/lamp/1", False),
        ("status/#", "status", True),
        ("status/#", "status/lamp/1", True),
        ("+/lamp", "status/lamp", True),
        ("#", "status/lamp", True),
        ("#", "$SYS/uptime", False),
        ("+/uptime", "$SYS/uptime", False),
        ("$SYS/#", "$SYS/uptime", True),
    ],
)
def test_topic_matching(topic_filter: str, topic: str, expected: bool) -> None:
    assert retained.matches(topic_filter, topic) is expected


def test_the_selectors_parse_and_pick_the_right_entries() -> None:
    exact = compile_selector(retained.selector_of_filter("it's/lamp"))
    prefix = compile_selector(retained.selector_of_filter("st_tus/+/x"))
    older = compile_selector(retained.older_than("status/lamp", 10))

    def message(topic: str, stamp: int = 5) -> bytes:
        publish = Publish(topic=topic, payload=b"1", qos=0)
        return retained.entry_of(publish, topic=topic, stamp=stamp)

    assert exact.matches(message("it's/lamp"))
    assert not exact.matches(message("it's/lamps"))
    assert prefix.matches(message("st_tus/a/x"))
    assert not prefix.matches(message("stXtus/a/x"))  # `_` is literal, not LIKE's any-one
    assert older.matches(message("status/lamp", 9))
    assert not older.matches(message("status/lamp", 10))
    assert not older.matches(message("status/door", 1))


@pytest.mark.parametrize(
    ("options", "existed", "sent"),
    [
        (0x00, False, True),
        (0x00, True, True),
        (0x10, False, True),  # 1: only for a new subscription
        (0x10, True, False),
        (0x20, False, False),  # 2: never
    ],
)
def test_retain_handling(options: int, existed: bool, sent: bool) -> None:
    assert retained.Options.of(options | 0x01).sends_on_subscribe(existed=existed) is sent


def test_retain_as_published_is_bit_3() -> None:
    assert retained.Options.of(0x08).retain_as_published
    assert not retained.Options.of(0x01).retain_as_published


def test_a_retained_message_goes_out_retained_at_the_lower_qos() -> None:
    entry = _entry("status/lamp", b"on", stamp=1, qos=2)
    assert retained.publish_of(entry, granted=1) == Publish(
        topic="status/lamp", payload=b"on", qos=1, retain=True, properties={}
    )


def test_the_retain_flag_travels_as_an_annotation() -> None:
    flagged = mapping.message_of(b"x", qos=1, properties={}, retain=True)
    plain = mapping.message_of(b"x", qos=1, properties={})
    assert retained.was_retained(flagged)
    assert not retained.was_retained(plain)


# -- wills --


def test_a_will_entry_reads_back() -> None:
    will = Will(
        topic="alerts/pump",
        payload=b"gone",
        qos=1,
        retain=True,
        properties={wills.WILL_DELAY_INTERVAL: 30, USER_PROPERTY: [("site", "north")]},
    )
    entry = wills.entry_of(will, key="mqtt:pump-1", stamp=7, gateway="gw-a")
    stored = wills.stored_of(entry)
    assert stored == wills.StoredWill(
        client="mqtt:pump-1",
        address="alerts/pump",
        body=b"gone",
        qos=1,
        retain=True,
        delay=30.0,
        stamp=7,
        gateway="gw-a",
        content_type=None,
        user={"site": "north"},
    )
    published = wills.message_of(stored)
    assert codec.read_body(published) == b"gone"
    assert codec.read_header(published).durable
    assert codec.read_application_properties(published) == {"site": "north"}
    assert retained.was_retained(published)


def test_an_amqp_clients_will_needs_only_its_client_and_address() -> None:
    sent = codec.encode_message(
        "sensor 7 lost", application_properties={"will_client": "s7", "will_address": "alerts"}
    )
    stored = wills.stored_of(sent)
    assert stored is not None
    assert (stored.client, stored.address, stored.body, stored.delay, stored.stamp) == (
        "s7",
        "alerts",
        "sensor 7 lost",
        0.0,
        None,
    )
    assert codec.read_body(wills.message_of(stored)) == "sensor 7 lost"


def test_a_message_without_client_or_address_is_not_a_will() -> None:
    assert wills.stored_of(codec.encode_message(b"x", application_properties={"a": 1})) is None


def test_will_selectors_pick_one_client_or_one_connection() -> None:
    will = Will(topic="t", payload=b"", qos=0, retain=False, properties={})
    first = wills.entry_of(will, key="mqtt:o'neil", stamp=1, gateway="g")
    second = wills.entry_of(will, key="mqtt:o'neil", stamp=2, gateway="g")
    other = wills.entry_of(will, key="mqtt:other", stamp=1, gateway="g")
    client = compile_selector(wills.selector_of("mqtt:o'neil"))
    connection = compile_selector(wills.selector_of("mqtt:o'neil", 2))
    assert [client.matches(m) for m in (first, second, other)] == [True, True, False]
    assert [connection.matches(m) for m in (first, second, other)] == [False, True, False]


def test_only_a_disconnect_with_reason_0_drops_the_will() -> None:
    assert wills.is_clean(0)
    assert not wills.is_clean(0x04)  # disconnect with will message
    assert not wills.is_clean(None)  # no DISCONNECT: the connection was lost


def test_a_router_notice_reads_back() -> None:
    notice = codec.encode_message(
        None, application_properties={LOST_CONTAINER: "s7", LOST_CLEAN: False}
    )
    assert wills.notice_of(notice) == ("s7", False)
    assert wills.notice_of(codec.encode_message(None)) is None
