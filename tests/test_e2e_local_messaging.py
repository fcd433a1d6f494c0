"""End to end on the local runtime: each address type carries messages with its semantics.

One `enmasse up` for the session (`local_runtime`), one address space `shop` applied as manifests
through the CLI, and real AMQP clients on the space's router endpoint (read from the space's status,
as a user would), logged in as the space's MessagingUser with SCRAM (its plan, standard-small,
lets no one in anonymously). What is asserted is what clients see: bodies, their order, outcomes,
none lost, none extra, and the router's error text.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from enmasse.amqp import codec, sasl
from enmasse.amqp.client import AmqpError, Client, Receiver
from enmasse.amqp.engine import Condition, Delivery, Outcome, Terminus

from tests.fixtures.local_runtime import LocalRuntime, enmasse

pytestmark = pytest.mark.slow

Connect = Callable[..., Client]

SHOP = """
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {name: shop}
spec: {type: standard, plan: standard-small}
---
apiVersion: enmasse.io/v1
kind: MessagingUser
metadata: {name: shopper, space: shop}
spec:
  username: shopper
  password: shop-password
  authorization: [{addresses: ["#"], operations: [send, recv]}]
"""
USER, PASSWORD = "shopper", "shop-password"

ADDRESSES = {
    "waiting": ("queue", "standard-small-queue", ""),
    "steady": ("queue", "standard-small-queue", ""),
    "doomed": ("queue", "standard-small-queue", ""),
    "work": ("anycast", "standard-anycast", ""),
    "rpc": ("anycast", "standard-anycast", ""),
    "fan": ("multicast", "standard-multicast", ""),
    "news": ("topic", "standard-small-topic", ""),
    "alerts": ("topic", "standard-small-topic", ""),
    "alerts-kept": ("subscription", "standard-small-subscription", "alerts"),
}


def address_manifest(name: str, kind: str, plan: str, topic: str = "", *, space: str) -> str:
    topic_line = f", topic: {topic}" if topic else ""
    return (
        "---\napiVersion: enmasse.io/v1\nkind: Address\n"
        f"metadata: {{name: {name}, space: {space}}}\n"
        f"spec: {{address: {name}, type: {kind}, plan: {plan}{topic_line}}}\n"
    )


@pytest.fixture(scope="module")
def shop(local_runtime: LocalRuntime) -> int:
    """The `shop` space with ADDRESSES, all Active; its router's amqp port."""
    text = SHOP + "".join(
        address_manifest(n, k, p, t, space="shop") for n, (k, p, t) in ADDRESSES.items()
    )
    local_runtime.apply(text, name="shop.yaml")
    local_runtime.wait_active("shop", list(ADDRESSES), timeout=180)
    return local_runtime.router_port("shop")


@pytest.fixture
def connect(shop: int) -> Iterator[Connect]:
    """A factory of clients on shop's router, every one closed at the end."""
    opened: list[Client] = []

    def make(container_id: str | None = None) -> Client:
        client = Client(
            "127.0.0.1",
            shop,
            timeout=15,
            container_id=container_id,
            user=USER,
            password=PASSWORD,
            mechanisms=sasl.CLIENT_MECHANISMS,
        )
        opened.append(client)
        return client

    yield make
    for client in opened:
        with contextlib.suppress(Exception):
            client.close()


def send_all(client: Client, address: str, bodies: list[str], *, durable: bool = False) -> None:
    sender = client.sender(address)
    for body in bodies:
        outcome = sender.send(codec.encode_message(body, durable=durable), timeout=15).outcome
        assert outcome is Outcome.ACCEPTED, f"{body}: {outcome}"


def take(receiver: Receiver, count: int, *, timeout: float = 15) -> list[str]:
    bodies = []
    for _ in range(count):
        delivery = receiver.receive(timeout)
        receiver.accept(delivery)
        bodies.append(str(codec.read_body(delivery.payload)))
    return bodies


def nothing_more(receiver: Receiver) -> bool:
    try:
        receiver.receive(0.5)
    except TimeoutError:
        return True
    return False


def test_a_queue_keeps_messages_while_no_consumer_is_attached(connect: Connect) -> None:
    bodies = [f"order-{i}" for i in range(5)]
    send_all(connect(), "waiting", bodies, durable=True)
    receiver = connect().receiver("waiting", credit=10)
    assert take(receiver, 5) == bodies
    assert nothing_more(receiver)


def test_anycast_balances_over_consumers_and_the_ack_comes_from_the_consumer(
    connect: Connect,
) -> None:
    consumers = [connect().receiver("work", credit=5) for _ in range(2)]
    sender = connect().sender("work")
    futures: list[Future[Delivery]] = [
        sender.send_async(codec.encode_message(f"job-{i}")) for i in range(10)
    ]
    got: list[list[str]] = [[], []]
    deadline = time.monotonic() + 20
    while sum(map(len, got)) < 10 and time.monotonic() < deadline:
        for i, consumer in enumerate(consumers):
            with contextlib.suppress(TimeoutError):
                delivery = consumer.receive(0.1)
                # Not yet accepted: the producer's delivery must still be open.
                assert not futures[int(str(codec.read_body(delivery.payload))[4:])].done()
                consumer.accept(delivery)
                got[i].append(str(codec.read_body(delivery.payload)))
    assert sorted(got[0] + got[1], key=lambda b: int(b[4:])) == [f"job-{i}" for i in range(10)]
    assert got[0], f"not balanced: {got}"
    assert got[1], f"not balanced: {got}"
    assert [f.result(15).outcome for f in futures] == [Outcome.ACCEPTED] * 10


def test_request_response_through_anycast_with_a_dynamic_reply_address(connect: Connect) -> None:
    server = connect()
    requests = server.receiver("rpc", credit=10)
    replies_out = server.sender(None)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                request = requests.receive(0.2)
            except (TimeoutError, AmqpError):
                continue
            body = str(codec.read_body(request.payload))
            replies_out.send_async(codec.encode_message(body.upper(), to=request.reply_to))
            requests.accept(request)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        client = connect()
        replies = client.receiver(None, source=Terminus(dynamic=True), credit=10)
        assert replies.address
        ask = client.sender("rpc")
        answers = []
        for word in ("one", "two", "three"):
            sent = ask.send(codec.encode_message(word, reply_to=replies.address), timeout=15)
            assert sent.outcome is Outcome.ACCEPTED
            answers.extend(take(replies, 1))
        assert answers == ["ONE", "TWO", "THREE"]
    finally:
        stop.set()
        thread.join(5)


def test_multicast_copies_each_message_to_every_consumer(connect: Connect) -> None:
    receivers = [connect().receiver("fan", credit=10) for _ in range(3)]
    bodies = [f"tick-{i}" for i in range(5)]
    send_all(connect(), "fan", bodies)
    assert [take(r, 5) for r in receivers] == [bodies] * 3
    assert all(nothing_more(r) for r in receivers)


def test_a_topic_copies_each_message_to_every_subscriber(connect: Connect) -> None:
    receivers = [connect().receiver("news", credit=10) for _ in range(2)]
    bodies = [f"headline-{i}" for i in range(3)]
    send_all(connect(), "news", bodies, durable=True)
    assert [take(r, 3) for r in receivers] == [bodies, bodies]
    assert all(nothing_more(r) for r in receivers)


def test_a_subscription_keeps_what_its_topic_published_while_its_reader_was_away(
    connect: Connect,
) -> None:
    publisher = connect()
    send_all(publisher, "alerts", ["a1", "a2", "a3"], durable=True)
    reader = connect().receiver("alerts-kept", credit=10)
    assert take(reader, 3) == ["a1", "a2", "a3"]
    reader.detach()
    send_all(publisher, "alerts", ["a4", "a5"], durable=True)
    back = connect().receiver("alerts-kept", credit=10)
    assert take(back, 2) == ["a4", "a5"]
    assert nothing_more(back)


def test_an_address_added_while_traffic_flows_disturbs_nothing(
    connect: Connect,
    local_runtime: LocalRuntime,
) -> None:
    bodies = [f"steady-{i}" for i in range(300)]
    outcomes: list[Outcome | None] = []
    sender = connect().sender("steady")

    def produce() -> None:
        deadline = time.monotonic() + 60
        for body in bodies:
            if time.monotonic() > deadline:
                return
            delivery = sender.send(codec.encode_message(body, durable=True), timeout=15)
            outcomes.append(delivery.outcome)
            time.sleep(0.005)  # spread the sends over the apply below

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    local_runtime.apply(
        address_manifest("late", "queue", "standard-small-queue", space="shop"), name="late.yaml"
    )
    local_runtime.wait_active("shop", ["late"])
    send_all(connect(), "late", ["late-1"])
    assert take(connect().receiver("late", credit=1), 1) == ["late-1"]
    producer.join(90)
    assert outcomes == [Outcome.ACCEPTED] * 300
    receiver = connect().receiver("steady", credit=100)
    assert take(receiver, 300) == bodies
    assert nothing_more(receiver)


def test_deleting_an_address_ends_its_traffic_with_a_clear_error(
    connect: Connect,
    local_runtime: LocalRuntime,
) -> None:
    receiver = connect().receiver("doomed", credit=10)
    send_all(connect(), "doomed", ["last"])
    assert take(receiver, 1) == ["last"]
    local_runtime.delete("address", "doomed", space="shop")
    with pytest.raises(AmqpError) as ended:
        receiver.receive(30)
    assert str(ended.value) == (
        "link detached: amqp:not-found: address 'doomed' was deleted from space 'shop'"
    )

    def refused() -> str:
        try:
            connect().sender("doomed").close()
        except AmqpError as error:
            return str(error)
        return ""

    deadline = time.monotonic() + 30
    while not (text := refused()) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert text == "attach refused: amqp:not-found: no address 'doomed' in space 'shop'"


def test_the_router_lets_in_only_the_spaces_users(shop: int, connect: Connect) -> None:
    """The space's user gets in with SCRAM (the keys config derived, the agent passed on); no
    one gets in anonymously, nor with PLAIN over the plain port, nor with a wrong password."""
    user = connect()
    assert user.call(lambda: user.connection.user) == "shopper"
    refusals = []
    for login in (
        lambda: Client("127.0.0.1", shop, timeout=15),
        # proton's PLAIN, which the plan does not offer on the plain port
        lambda: Client("127.0.0.1", shop, timeout=15, user=USER, password=PASSWORD),
        lambda: Client(
            "127.0.0.1",
            shop,
            timeout=15,
            user=USER,
            password="guess",
            mechanisms=sasl.CLIENT_MECHANISMS,
        ),
    ):
        with pytest.raises(AmqpError) as refused:
            login().close()
        refusals.append(refused.value.condition)
    assert refusals == [
        Condition("amqp:unauthorized-access", "Authentication failed [mech=none]"),
        Condition("amqp:unauthorized-access", "Authentication failed [mech=none]"),
        Condition("amqp:unauthorized-access", "Authentication failed [mech=SCRAM-SHA-512]"),
    ]


def test_a_brokered_space_serves_clients_from_its_one_broker(local_runtime: LocalRuntime) -> None:
    """examples/jms-space.yaml: no router; the space's endpoint is its broker's, and the CLI's
    send and receive find it in the space's status, logged in as the space's user (the broker
    lets no one in anonymously, as the plan says, nor a user of another space)."""
    example = Path(__file__).resolve().parents[1] / "examples" / "jms-space.yaml"
    local_runtime.apply(example.read_text(), name="jms-space.yaml")
    local_runtime.wait_active("jms", ["invoices", "notifications"], timeout=120)
    space = local_runtime.address_space("jms")
    assert space.status.status.phase == "Active"
    port = local_runtime.router_port("jms")
    assert sorted(p for p in local_runtime.processes() if p.startswith("jms-")) == ["jms-broker-0"]
    ports = json.loads((local_runtime.var / "brokers/jms/jms-broker-0/ports.json").read_text())
    assert port == ports["amqp"]  # the broker itself: no router in between

    def scram(user: str, password: str) -> Client:
        return Client(
            "127.0.0.1", port, timeout=15, user=user, password=password,
            mechanisms=sasl.CLIENT_MECHANISMS,
        )  # fmt: skip

    refusals = []
    for login in (
        lambda: Client("127.0.0.1", port, timeout=15),  # anonymous
        lambda: scram(USER, PASSWORD),  # the user of another space
    ):
        with pytest.raises(AmqpError) as refused:
            login().close()
        refusals.append(refused.value.condition)
    assert refusals == [
        Condition("amqp:unauthorized-access", "Authentication failed [mech=none]"),
        Condition("amqp:unauthorized-access", "Authentication failed [mech=SCRAM-SHA-512]"),
    ]

    app = ("--user", "app", "--password", "demo-password")
    sent = enmasse(
        local_runtime.var, "send", "invoices", "--space", "jms", "-n", "2", "--body", "inv", *app
    )
    assert (sent.returncode, sent.stdout.strip()) == (
        0,
        "sent 2 messages to queue 'invoices' (accepted)",
    )
    got = enmasse(local_runtime.var, "receive", "invoices", "--space", "jms", "-n", "2", *app)
    assert (got.returncode, got.stdout.split()) == (0, ["inv", "inv"]), got.stderr
    with scram("app", "demo-password") as client:
        receiver = client.receiver("invoices", credit=10)
        assert nothing_more(receiver)
