"""JMS selectors over real AMQP: Qpid Proton's own blocking client (the `Selector` receiver option
of its examples) against a real `enmasse-broker` process.

A queue's consumers take only what they select, in order, and leave the rest; a topic
subscription's queue receives only what its selector selects; a selector that does not parse is
refused with amqp:invalid-field and the parser's words; the attach echoes the filter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Terminus
from enmasse.amqp.selector import SELECTOR_FILTER_SYMBOL
from proton import Described, Message, ProtonException, Timeout, symbol
from proton.reactor import Container, DurableSubscription, Selector
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.waiting import wait_for

TIMEOUT = 10


@pytest.fixture
def connect(broker: BrokerProcess) -> Iterator[object]:
    """Opens proton BlockingConnections to the broker; all closed at the end."""
    opened: list[BlockingConnection] = []

    def open_one(container_id: str | None = None) -> BlockingConnection:
        container = Container()
        if container_id is not None:
            container.container_id = container_id  # a durable subscription is named after it
        url = f"127.0.0.1:{broker.amqp_port}"
        conn = BlockingConnection(url, timeout=TIMEOUT, container=container)
        opened.append(conn)
        return conn

    yield open_one
    for conn in opened:
        with contextlib.suppress(ProtonException):  # e.g. its broker was restarted under it
            conn.close()


def send_all(conn: BlockingConnection, address: str, messages: list[Message]) -> None:
    sender = conn.create_sender(address)
    for message in messages:
        sender.send(message)  # blocks until the broker settles it
    sender.close()


def take(receiver: BlockingReceiver, count: int) -> list[Message]:
    got = []
    for _ in range(count):
        got.append(receiver.receive(timeout=TIMEOUT))
        receiver.accept()
    return got


def nothing_more(receiver: BlockingReceiver) -> bool:
    try:
        receiver.receive(timeout=0.5)
    except Timeout:
        return True
    return False


def test_two_consumers_selecting_halves_each_get_exactly_their_half_in_order(
    broker: BrokerProcess, connect: object
) -> None:
    broker.ensure_queue("work")
    a_conn, b_conn, producer = connect(), connect(), connect()  # type: ignore[operator]
    a = a_conn.create_receiver("work", credit=7, options=Selector("half = 'a'"))
    b = b_conn.create_receiver("work", credit=5, options=Selector("half = 'b'"))
    send_all(
        producer,
        "work",
        [Message(body=n, properties={"half": "a" if n % 2 else "b"}) for n in range(200)],
    )
    got_a = [m.body for m in take(a, 100)]
    got_b = [m.body for m in take(b, 100)]
    assert got_a == list(range(1, 200, 2))
    assert got_b == list(range(0, 200, 2))
    assert nothing_more(a)
    assert nothing_more(b)
    wait_for(lambda: broker.addresses()["work"].depth == 0, what="depth", limit=TIMEOUT)


def test_what_no_consumer_selects_stays_in_the_queue_for_the_next_in_order(
    broker: BrokerProcess, connect: object
) -> None:
    broker.ensure_queue("orders")
    conn = connect()  # type: ignore[operator]
    colors = ["red", "blue", "blue", "red", "green", "red", "blue"]
    send_all(
        conn, "orders", [Message(body=i, properties={"color": c}) for i, c in enumerate(colors)]
    )
    reds = conn.create_receiver("orders", credit=10, options=Selector("color = 'red'"))
    assert [m.body for m in take(reds, 3)] == [0, 3, 5]
    assert nothing_more(reds)
    wait_for(lambda: broker.addresses()["orders"].depth == 4, what="depth", limit=TIMEOUT)
    rest = connect().create_receiver("orders", credit=10)  # type: ignore[operator]
    assert [m.body for m in take(rest, 4)] == [1, 2, 4, 6]
    wait_for(lambda: broker.addresses()["orders"].depth == 0, what="depth", limit=TIMEOUT)


def test_jms_and_amqp_header_names_select_on_the_header_and_properties(
    broker: BrokerProcess, connect: object
) -> None:
    broker.ensure_queue("urgent")
    conn = connect()  # type: ignore[operator]
    send_all(
        conn,
        "urgent",
        [
            Message(body="low", priority=1, subject="invoice"),
            Message(body="high", priority=8, subject="invoice"),
            Message(body="high-order", priority=9, subject="order"),
        ],
    )
    selector = Selector("JMSPriority > 5 AND amqp.subject = 'invoice'")
    receiver = conn.create_receiver("urgent", credit=10, options=selector)
    assert [m.body for m in take(receiver, 1)] == ["high"]
    assert nothing_more(receiver)


def test_a_subscription_with_a_selector_receives_only_what_it_selects_across_a_restart(
    broker: BrokerProcess, connect: object
) -> None:
    broker.ensure_topic("prices")
    options = [DurableSubscription(), Selector("currency = 'EUR' AND amount >= 100")]
    quotes = [("EUR", 150), ("USD", 500), ("EUR", 50), ("EUR", 100), ("GBP", 120)]
    selected = ["EUR150", "EUR100"]

    def publish() -> None:
        send_all(
            connect(),  # type: ignore[operator]
            "prices",
            [
                Message(body=f"{c}{a}", durable=True, properties={"currency": c, "amount": a})
                for c, a in quotes
            ],
        )

    def depth() -> int:
        return broker.addresses()["prices"].depth

    subscriber = connect("trader")  # type: ignore[operator]
    eur = subscriber.create_receiver("prices", name="eur", credit=10, options=options)
    everything = connect().create_receiver("prices", credit=20)  # type: ignore[operator]
    publish()
    assert [m.body for m in take(eur, 2)] == selected
    assert nothing_more(eur)
    assert [m.body for m in take(everything, 5)] == [f"{c}{a}" for c, a in quotes]
    subscriber.close()  # durable: the subscription keeps collecting while its subscriber is away
    wait_for(lambda: broker.addresses()["prices"].consumers == 1, what="detach", limit=TIMEOUT)
    publish()
    assert [m.body for m in take(everything, 5)] == [f"{c}{a}" for c, a in quotes]
    # the subscription's queue holds only what its selector selected: 2 of the 5
    wait_for(lambda: depth() == 2, what="2 selected messages held", limit=TIMEOUT)
    broker.restart()  # SIGKILL, then start on the same data dir
    assert depth() == 2
    publish()  # the selector came back with the subscription (the catalog keeps it)
    wait_for(lambda: depth() == 4, what="2 more selected messages held", limit=TIMEOUT)
    back = connect("trader").create_receiver(  # type: ignore[operator]
        "prices", name="eur", credit=10, options=options
    )
    assert [m.body for m in take(back, 4)] == selected + selected
    assert nothing_more(back)


def test_a_selector_that_does_not_parse_is_refused_with_invalid_field(
    broker: BrokerProcess, connect: object
) -> None:
    broker.ensure_queue("work")
    broker.ensure_topic("news")
    conn = connect()  # type: ignore[operator]
    for address in ("work", "news"):
        with pytest.raises(LinkDetached) as refused:
            conn.create_receiver(address, name=f"bad-{address}", options=Selector("color = 'red"))
        condition = refused.value.link.remote_condition
        assert condition.name == "amqp:invalid-field"
        assert condition.description == (
            'invalid selector at column 9 (near "\'red"): a string that is never closed'
        )
    with pytest.raises(LinkDetached) as refused:
        conn.create_receiver(
            "work", name="worse", options=Selector("weight > 2 AND color == 'red'")
        )
    assert refused.value.link.remote_condition.description == (
        "invalid selector at column 23 (near \"= 'red'\"): unexpected '='; expected one of: "
        "'(', + or -, FALSE, TRUE, a number, a string, an identifier"
    )
    # the connection is fine: only that link was refused
    receiver = conn.create_receiver("work", name="good", options=Selector("color = 'red'"))
    send_all(conn, "work", [Message(body="x", properties={"color": "red"})])
    assert [m.body for m in take(receiver, 1)] == ["x"]


def test_the_attach_echoes_the_selector_filter(broker: BrokerProcess, connect: object) -> None:
    broker.ensure_queue("work")
    receiver = connect().create_receiver(  # type: ignore[operator]
        "work", options=Selector("half = 'a'", name="jms-selector")
    )
    echoed = receiver.link.remote_source.filter
    echoed.rewind()
    echoed.next()
    assert echoed.get_object() == {
        symbol("jms-selector"): Described(symbol("apache.org:selector-filter:string"), "half = 'a'")
    }


def test_a_shared_subscription_in_use_refuses_another_selector_with_resource_locked(
    broker: BrokerProcess,
) -> None:
    broker.ensure_topic("alerts")

    def shared(selector: str) -> Terminus:
        return Terminus(
            address="alerts",
            durable=2,
            expiry_policy="never",
            capabilities=("shared",),
            filter={"jms-selector": Described(symbol(SELECTOR_FILTER_SYMBOL), selector)},
        )

    with (
        Client("127.0.0.1", broker.amqp_port) as first,
        Client("127.0.0.1", broker.amqp_port) as second,
        Client("127.0.0.1", broker.amqp_port) as third,
    ):
        first.receiver("alerts", name="watch", source=shared("level > 3"))
        second.receiver("alerts", name="watch", source=shared("level > 3"))  # the same: joins
        with pytest.raises(AmqpError) as refused:
            third.receiver("alerts", name="watch", source=shared("level > 1"))
    assert refused.value.condition is not None
    assert refused.value.condition.name == "amqp:resource-locked"
    assert refused.value.condition.description == (
        "subscription 'watch' of 'alerts' has consumers with the selector 'level > 3'; it "
        "cannot change to 'level > 1' until they detach"
    )
