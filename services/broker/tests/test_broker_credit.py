"""A producer's credit on a real broker process: a window of messages bounded in bytes.

A link of 1 MiB messages with no consumer holds a few of them, not the 1,000 a link of 100 B
messages holds; a new link starts bounded by the largest message it may send (a broker that
serves routers takes up to 512 MiB: one message); every message still arrives, in order.
Credit is read as the producer sees it: proton's `link.credit` on its sender, after each
send is settled (the broker's flow goes out with, or before, its settlement).
"""

from __future__ import annotations

from enmasse.amqp import codec
from enmasse.amqp.client import Client
from proton import Message
from proton.utils import BlockingConnection

from tests.fixtures.broker import BrokerProcess

MIB = 1 << 20


def _credits_while_sending(port: int, address: str, bodies: list[bytes]) -> tuple[int, list[int]]:
    """(the credit before the first send, the credit after each settled send)."""
    conn = BlockingConnection(f"127.0.0.1:{port}", timeout=60)
    try:
        sender = conn.create_sender(address)
        conn.wait(lambda: sender.link.credit > 0, msg="the first credit")
        first = sender.link.credit
        after = []
        for body in bodies:
            sender.send(Message(body=body))
            after.append(sender.link.credit)
        return first, after
    finally:
        conn.close()


def _received(port: int, address: str, count: int) -> list[bytes]:
    client = Client("127.0.0.1", port, timeout=30)
    try:
        receiver = client.receiver(address, credit=20)
        got = []
        for _ in range(count):
            delivery = receiver.receive(30)
            got.append(codec.read_body(delivery.payload))
            receiver.accept(delivery)
        return got
    finally:
        client.close()


def test_a_producer_of_large_messages_holds_a_few_and_small_ones_the_full_window(
    broker: BrokerProcess,
) -> None:
    broker.ensure_queue("large", persistent=False)
    broker.ensure_queue("small", persistent=False)
    port = broker.amqp_port

    large = [bytes([n]) * MIB for n in range(40)]
    first, credits = _credits_while_sending(port, "large", large)
    assert first == 1, "before any message: 16 MiB of messages of the max size (512 MiB)"
    assert max(credits) <= 16, credits
    assert max(credits) >= 8, f"a few 1 MiB messages at a time, not one: {credits}"

    small = [b"%05d" % n + b"x" * 95 for n in range(1200)]
    first, credits = _credits_while_sending(port, "small", small)
    assert first == 1
    assert max(credits) == 1000, "100 B messages: the full window"
    assert min(credits) >= 499, "topped up in half windows, never shrunk"

    assert _received(port, "large", len(large)) == large
    assert _received(port, "small", len(small)) == small
