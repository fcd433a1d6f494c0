"""Message groups over real AMQP: Qpid Proton's blocking client against a real `enmasse-broker`.

Two consumers compete on one queue: every message of a group (`group-id`) reaches the same one,
in the order sent, while ungrouped messages go to both. When a group's consumer closes with
messages of the group unsettled, the group moves to the other consumer, which gets those
messages again, in order, and the rest of the group after them; none is lost, and none it
accepted comes back.
"""

from __future__ import annotations

from proton import Message, Timeout
from proton.utils import BlockingReceiver

from tests.fixtures.broker import BrokerProcess

TIMEOUT = 10
QUIET = 1.0  # how long a receiver must get nothing to count as "nothing more for it"


def grouped(body: str, group: str | None, sequence: int | None = None) -> Message:
    if group is None:
        return Message(body=body)
    return Message(body=body, group_id=group, group_sequence=sequence)


def drain(receiver: BlockingReceiver) -> list[Message]:
    """Everything the receiver gets until it has been quiet for QUIET seconds, accepted."""
    got = []
    while True:
        try:
            got.append(receiver.receive(timeout=QUIET))
        except Timeout:
            return got
        receiver.accept()


def test_a_group_stays_on_one_consumer_while_ungrouped_messages_spread(
    broker: BrokerProcess,
) -> None:
    broker.ensure_queue("orders")
    layout = ["A", "B", None, None, "A", "B", None, "A", None, "B"] * 5
    with broker.proton(timeout=TIMEOUT) as conn:
        first = conn.create_receiver("orders", credit=100, name="first")
        second = conn.create_receiver("orders", credit=100, name="second")
        sender = conn.create_sender("orders")
        for n, group in enumerate(layout):
            sender.send(grouped(str(n), group, sequence=n))
        got = {"first": drain(first), "second": drain(second)}
    numbers = sorted(int(str(m.body)) for messages in got.values() for m in messages)
    assert numbers == list(range(len(layout)))  # all of them, once
    for messages in got.values():
        bodies = [int(str(m.body)) for m in messages]
        assert bodies == sorted(bodies)  # each consumer sees them in the order sent
    groups_of = {name: {m.group_id for m in messages} for name, messages in got.items()}
    for group in ("A", "B"):
        holders = [name for name, groups in groups_of.items() if group in groups]
        assert len(holders) == 1, f"group {group} went to {holders}"
    assert all(None in groups for groups in groups_of.values())  # ungrouped: both


def test_a_group_moves_when_its_consumer_closes(broker: BrokerProcess) -> None:
    broker.ensure_queue("sessions")
    with broker.proton(timeout=TIMEOUT) as conn:
        one = conn.create_receiver("sessions", credit=100, name="one")
        two = conn.create_receiver("sessions", credit=100, name="two")
        sender = conn.create_sender("sessions")
        for n in range(10):
            sender.send(grouped(f"g{n}", "G", sequence=n))
        try:
            head = one.receive(timeout=QUIET * 2)
            owner, other = one, two
        except Timeout:
            head = two.receive(timeout=TIMEOUT)
            owner, other = two, one
        assert head.body == "g0"
        owner.accept()
        for expected in ("g1", "g2"):
            assert owner.receive(timeout=TIMEOUT).body == expected
            owner.accept()
        # g3..g9 reached the owner (its credit) but stay unsettled when it closes.
        owner.close()
        moved = drain(other)
        assert [m.body for m in moved] == [f"g{n}" for n in range(3, 10)]
        for n in range(10, 13):  # the group's next messages follow it
            sender.send(grouped(f"g{n}", "G", sequence=n))
        assert [m.body for m in drain(other)] == ["g10", "g11", "g12"]
