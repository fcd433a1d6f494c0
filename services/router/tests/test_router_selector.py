"""JMS selectors through a standard space's router: the consumer's selector filter travels on the
router's feed link to the broker, which applies it; a bad selector is refused by the router at
attach, with amqp:invalid-field and the parser's words, before any broker is asked."""

from __future__ import annotations

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Terminus
from enmasse.amqp.selector import SELECTOR_FILTER_KEY, SELECTOR_FILTER_SYMBOL
from proton import Described, symbol

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.router import RouterFleet, RouterProcess
from tests.fixtures.waiting import wait_for


def _connect(router: RouterProcess, opened: list[Client]) -> Client:
    opened.append(Client("127.0.0.1", router.amqp_port))
    return opened[-1]


def _selecting(address: str, selector: str) -> Terminus:
    return Terminus(
        address=address,
        filter={SELECTOR_FILTER_KEY: Described(symbol(SELECTOR_FILTER_SYMBOL), selector)},
    )


def _orders_router(routers: RouterFleet, broker: BrokerProcess) -> RouterProcess:
    broker.ensure_queue("orders")
    router = routers.start_before_queue("orders", broker_port=broker.amqp_port)
    return router


def _numbers(receiver: object, count: int) -> list[int]:
    got = []
    for _ in range(count):
        delivery = receiver.receive(10)  # type: ignore[attr-defined]
        got.append(int(codec.read_body(delivery.payload)))
        receiver.accept(delivery)  # type: ignore[attr-defined]
    return got


def test_consumers_through_the_router_get_what_their_selectors_select(
    routers: RouterFleet, broker: BrokerProcess, clients: list[Client]
) -> None:
    router = _orders_router(routers, broker)
    a = _connect(router, clients).receiver(
        "orders", credit=5, source=_selecting("orders", "half = 'a'")
    )
    b = _connect(router, clients).receiver(
        "orders", credit=5, source=_selecting("orders", "half = 'b'")
    )
    sender = _connect(router, clients).sender("orders")
    for n in range(40):
        half = "a" if n % 2 else "b"
        payload = codec.encode_message(str(n).encode(), application_properties={"half": half})
        sender.send(payload)
    assert _numbers(a, 20) == list(range(1, 40, 2))
    assert _numbers(b, 20) == list(range(0, 40, 2))
    wait_for(lambda: broker.addresses()["orders"].depth == 0, what="orders empty", limit=10)


def test_what_the_selector_does_not_select_stays_at_the_broker(
    routers: RouterFleet, broker: BrokerProcess, clients: list[Client]
) -> None:
    router = _orders_router(routers, broker)
    sender = _connect(router, clients).sender("orders")
    for n in range(10):
        color = "red" if n in (3, 7) else "blue"
        sender.send(codec.encode_message(str(n).encode(), application_properties={"c": color}))
    reds = _connect(router, clients).receiver(
        "orders", credit=10, source=_selecting("orders", "c = 'red'")
    )
    assert _numbers(reds, 2) == [3, 7]
    wait_for(lambda: broker.addresses()["orders"].depth == 8, what="8 blues left", limit=10)
    with pytest.raises(TimeoutError):
        reds.receive(0.5)


def test_a_bad_selector_is_refused_by_the_router_with_invalid_field(
    routers: RouterFleet, broker: BrokerProcess, clients: list[Client]
) -> None:
    router = _orders_router(routers, broker)
    client = _connect(router, clients)
    with pytest.raises(AmqpError) as refused:
        client.receiver("orders", source=_selecting("orders", "c = 'red' AND"))
    assert refused.value.condition is not None
    assert refused.value.condition.name == "amqp:invalid-field"
    assert refused.value.condition.description == (
        "invalid selector at the end: it ends too early; expected one of: '(', + or -, FALSE, "
        "NOT, TRUE, a number, a string, an identifier"
    )
