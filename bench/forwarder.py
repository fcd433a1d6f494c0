"""The engine as an intermediary: a bare forwarder process, to show what the router can at most do.

What flows in: producers attach receiving links (to us) on an address, consumers attach sending
links on the same address. What flows out: each message, as the same bytes, to the address's
consumer; in acked mode the consumer's outcome goes back to the producer's delivery (so the
producer's ack means "the consumer took it", the router's anycast contract), in pre-settled mode
the forwarder takes and passes on.

Why it exists: the router does more per message (addressing, balancing, the mesh), so its figures
belong beside this one (no routing logic, same engine) and the client ceiling (no intermediary).
Credit: a producer holds a fixed window; one credit returns each time a message leaves the
forwarder (pre-settled) or comes back settled (acked). Messages that arrive while the consumer
has no credit wait in a per-address backlog, bounded by the producers' windows.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from enmasse.amqp.engine import (
    Condition,
    ConnectionHandler,
    Delivery,
    Engine,
    Link,
    Outcome,
    settle_gc_for_message_loop,
)

from bench.harness import Context, Table, latency_table, suite, throughput_table

WINDOW = 1000


class Relay:
    """State shared by every connection of the forwarder: consumers and backlogs by address."""

    def __init__(self) -> None:
        self.consumers: dict[str, deque[Link]] = {}
        self.backlog: dict[str, deque[tuple[Delivery, Link]]] = {}

    def consumer_for(self, address: str) -> Link | None:
        """Round-robin over the address's consumers that have credit."""
        ring = self.consumers.get(address)
        if not ring:
            return None
        for _ in range(len(ring)):
            link = ring[0]
            ring.rotate(-1)
            if link.credit > 0:
                return link
        return None

    def forward(self, consumer: Link, delivery: Delivery, producer: Link) -> None:
        if delivery.pre_settled:
            consumer.send(delivery.payload, settled=True)
            producer.flow(1)
        else:
            consumer.send(delivery.payload, context=(delivery, producer))

    def pump(self, address: str) -> None:
        backlog = self.backlog.get(address)
        while backlog:
            consumer = self.consumer_for(address)
            if consumer is None:
                return
            delivery, producer = backlog.popleft()
            self.forward(consumer, delivery, producer)


class RelayConnection(ConnectionHandler):
    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    def on_link_attach(self, link: Link) -> None:
        address = link.address
        if not address:
            link.refuse(Condition("amqp:not-found", "the forwarder needs an address"))
            return
        link.accept()
        if link.is_receiver:
            link.flow(WINDOW)
        else:
            self.relay.consumers.setdefault(address, deque()).append(link)

    def on_message(self, link: Link, delivery: Delivery) -> None:
        address = link.address
        assert address is not None
        backlog = self.relay.backlog.setdefault(address, deque())
        consumer = None if backlog else self.relay.consumer_for(address)
        if consumer is None:
            backlog.append((delivery, link))
        else:
            self.relay.forward(consumer, delivery, link)

    def on_link_credit(self, link: Link) -> None:
        if link.address:
            self.relay.pump(link.address)

    def on_outcome(self, link: Link, delivery: Delivery, outcome: Outcome) -> None:
        original, producer = delivery.context
        original.settle(outcome, error=delivery.error)
        producer.flow(1)

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        if link.is_sender and link.address in self.relay.consumers:
            ring = self.relay.consumers[link.address]
            if link in ring:
                ring.remove(link)
            for sent in link.unsettled:
                original, producer = sent.context
                original.settle(Outcome.RELEASED)
                producer.flow(1)


def _serve(ports: Any) -> None:
    engine = Engine(container_id="bench-forwarder")
    relay = Relay()
    ports.put(
        engine.listen(host="127.0.0.1", port=0, handler_factory=lambda: RelayConnection(relay))
    )
    settle_gc_for_message_loop()
    engine.run()


def serve_with_port_file(path: str) -> None:
    """The forwarder as a plain process (`python -c`, e.g. under valgrind): writes its port to
    `path` once listening; SIGTERM ends it."""
    engine = Engine(container_id="bench-forwarder")
    relay = Relay()
    port = engine.listen(host="127.0.0.1", port=0, handler_factory=lambda: RelayConnection(relay))
    partial = Path(f"{path}.partial")
    partial.write_text(str(port))
    partial.rename(path)
    signal.signal(signal.SIGTERM, lambda *_: engine.stop())
    settle_gc_for_message_loop()
    engine.run()


@suite("forwarder", "a bare forwarder on the engine (no routing logic): the router's upper bound")
def forwarder_suite(ctx: Context) -> Iterator[Table]:
    spawn = multiprocessing.get_context("spawn")
    ports = spawn.Queue()
    process = spawn.Process(target=_serve, args=(ports,), daemon=True)
    process.start()
    try:
        port = ports.get(timeout=30)
        assert process.pid is not None
        yield throughput_table(
            ctx,
            "Engine forwarder (producer -> forwarder process -> consumer)",
            host="127.0.0.1",
            port=port,
            address=[f"fwd-{i}" for i in range(4)],
            peer_pid=process.pid,
        )
        yield latency_table(ctx, "Engine forwarder latency", host="127.0.0.1", port=port)
    finally:
        process.kill()
        process.join(5)
