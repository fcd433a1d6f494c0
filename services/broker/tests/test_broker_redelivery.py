"""What a consumer's outcome does to a message's header the next time out, over real AMQP (AMQP 1.0
§3.2.1, §3.4.4, §3.4.5): released gives it back unchanged (same delivery-count) but acquired, so
a producer's first-acquirer=true is false on any later delivery; modified with delivery-failed
adds one to the delivery-count and counts as a failed attempt; modified without it changes
nothing; undeliverable-here keeps it from the link that said so; and only failed attempts lead
to the dead-letter address, however often a message was released.
"""

from __future__ import annotations

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client, Receiver
from enmasse.amqp.engine import Delivery, Outcome

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.waiting import wait_for


def first_acquirer_message(text: str) -> bytes:
    """A message whose producer says no one has acquired it yet (header first-acquirer=true)."""
    return codec.with_header(codec.encode_message(text), codec.Header(first_acquirer=True))


def take(receiver: Receiver) -> tuple[str, codec.Header, Delivery]:
    delivery = receiver.receive(10)
    return str(codec.read_body(delivery.payload)), codec.read_header(delivery.payload), delivery


def test_released_comes_back_unchanged_but_no_longer_first_acquirer(broker: BrokerProcess) -> None:
    broker.ensure_queue("work")
    with Client("127.0.0.1", broker.amqp_port) as c:
        assert c.sender("work").send(first_acquirer_message("job")).outcome is Outcome.ACCEPTED
        first = c.receiver("work", credit=0)  # one credit at a time: it holds none at the end
        first.flow(1)
        text, header, delivery = take(first)
        assert (text, header.delivery_count, header.first_acquirer) == ("job", 0, True)
        first.settle(delivery, Outcome.RELEASED)
        first.flow(1)
        text, header, delivery = take(first)  # the same link: unchanged, but acquired before
        assert (text, header.delivery_count, header.first_acquirer) == ("job", 0, False)
        first.settle(delivery, Outcome.RELEASED)
        first.close()
        second = c.receiver("work", credit=1)
        text, header, delivery = take(second)
        assert (text, header.delivery_count, header.first_acquirer) == ("job", 0, False)
        second.accept(delivery)
    wait_for(lambda: broker.addresses()["work"].dequeued == 1, what="the accept")
    assert broker.addresses()["work"].depth == 0


def test_modified_with_delivery_failed_counts_one_and_without_it_nothing(
    broker: BrokerProcess,
) -> None:
    broker.ensure_queue("work")
    with Client("127.0.0.1", broker.amqp_port) as c:
        c.sender("work").send(codec.encode_message("job"))
        worker = c.receiver("work", credit=1)
        counts = []
        for failed in (True, False, True, False):
            _, header, delivery = take(worker)
            counts.append(header.delivery_count)
            worker.settle(delivery, Outcome.MODIFIED, delivery_failed=failed)
        _, header, delivery = take(worker)
        counts.append(header.delivery_count)
        worker.accept(delivery)
    assert counts == [0, 1, 1, 2, 2]


def test_undeliverable_here_never_goes_back_to_that_link(broker: BrokerProcess) -> None:
    broker.ensure_queue("work")
    with Client("127.0.0.1", broker.amqp_port) as c:
        picky = c.receiver("work", credit=0)
        picky.flow(1)
        c.sender("work").send(first_acquirer_message("job"))
        _, _, delivery = take(picky)
        picky.flow(5)
        picky.settle(delivery, Outcome.MODIFIED, delivery_failed=True, undeliverable_here=True)
        with pytest.raises(TimeoutError):
            picky.receive(timeout=0.5)  # it has credit, and the message waits for another
        other = c.receiver("work", credit=1)
        text, header, again = take(other)
        assert (text, header.delivery_count, header.first_acquirer) == ("job", 1, False)
        other.settle(again, Outcome.RELEASED)  # released by the other: still never to `picky`
        text, header, again = take(other)
        assert (text, header.delivery_count) == ("job", 1)
        other.accept(again)
        with pytest.raises(TimeoutError):
            picky.receive(timeout=0.3)


def test_only_failed_attempts_make_a_dead_letter(broker: BrokerProcess) -> None:
    broker.ensure_queue("DLQ")
    broker.ensure_queue("jobs", max_delivery_attempts=2, dead_letter_address="DLQ")
    with Client("127.0.0.1", broker.amqp_port) as c:
        c.sender("jobs").send(codec.encode_message("shy"))
        worker = c.receiver("jobs", credit=1)
        for _ in range(10):  # far more releases than attempts allowed
            _, header, delivery = take(worker)
            assert header.delivery_count == 0
            worker.settle(delivery, Outcome.RELEASED)
        _, _, delivery = take(worker)
        worker.accept(delivery)

        c.sender("jobs").send(codec.encode_message("poison"))
        seen = []
        for outcome in (Outcome.RELEASED, Outcome.MODIFIED, Outcome.RELEASED, Outcome.MODIFIED):
            text, header, delivery = take(worker)
            seen.append((text, header.delivery_count))
            worker.settle(delivery, outcome, delivery_failed=outcome is Outcome.MODIFIED)
        assert seen == [("poison", 0), ("poison", 0), ("poison", 1), ("poison", 1)]
        text, header, _ = take(c.receiver("DLQ", credit=1))
        assert (text, header.delivery_count) == ("poison", 2)
    listed = broker.addresses()
    assert (listed["jobs"].depth, listed["jobs"].dead_lettered, listed["DLQ"].enqueued) == (0, 1, 1)
