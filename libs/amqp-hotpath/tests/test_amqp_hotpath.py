"""The C side of the engine's hot path, on two proton engines wired together in memory.

No sockets and no engine loop: a sender side and a receiver side, each a proton connection with
its own transport and collector, and bytes moved between the transports by hand. That shows
amqp_hotpath's contract itself: what `next_event` hands back for each kind of event (and what it
swallows), that `send`/`settle` do what proton's own calls would, and how `read`/`write` report
a socket's state. The engine's behaviour on top is covered by libs/common/tests.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import enmasse.amqp_hotpath as amqp_hotpath
import pytest
from cproton_ffi import ffi, lib
from enmasse.amqp import engine  # binds amqp_hotpath to proton's functions

assert engine  # imported for its binding


def _address(pointer: object) -> int:
    return int(ffi.cast("uintptr_t", pointer))


class _Side:
    """One proton connection, its transport and collector."""

    def __init__(self, *, server: bool) -> None:
        self.collector = lib.pn_collector()
        self.connection = lib.pn_connection()
        self.transport = lib.pn_transport()
        if server:
            lib.pn_transport_set_server(self.transport)
        lib.pn_connection_collect(self.connection, self.collector)
        lib.pn_transport_bind(self.transport, self.connection)
        lib.pn_connection_open(self.connection)
        self.session = lib.pn_session(self.connection)
        lib.pn_session_open(self.session)

    def records(self) -> list[tuple]:
        found = []
        while (record := amqp_hotpath.next_event(_address(self.collector))) is not None:
            found.append(record)
        return found


class _Pair:
    """A sender link on one side, its receiver on the other, the receiver granting credit."""

    def __init__(self, *, credit: int = 10, settled: bool = False, max_frame: int = 0) -> None:
        self.client = _Side(server=False)
        self.server = _Side(server=True)
        if max_frame:
            lib.pn_transport_set_max_frame(self.server.transport, max_frame)
        self.sender = lib.pn_sender(self.client.session, b"link")
        lib.pn_terminus_set_address(lib.pn_link_target(self.sender), b"q")
        if settled:
            lib.pn_link_set_snd_settle_mode(self.sender, lib.PN_SND_SETTLED)
        lib.pn_link_open(self.sender)
        self.pump()
        self.server.records()  # the endpoint events of the set-up
        self.receiver = lib.pn_link_head(self.server.connection, lib.PN_LOCAL_UNINIT)
        lib.pn_session_open(lib.pn_link_session(self.receiver))
        lib.pn_link_open(self.receiver)
        lib.pn_link_flow(self.receiver, credit)
        self.pump()
        self.client.records()
        self.server.records()

    def pump(self) -> None:
        """Moves every pending byte both ways until neither side has more."""
        moved = True
        while moved:
            moved = self._move(self.client.transport, self.server.transport)
            moved = self._move(self.server.transport, self.client.transport) or moved

    @staticmethod
    def _move(source: object, target: object) -> bool:
        size = min(lib.pn_transport_pending(source), lib.pn_transport_capacity(target))
        if size <= 0:
            return False
        buffer = ffi.new("char[]", size)
        lib.pn_transport_peek(source, buffer, size)
        lib.pn_transport_pop(source, size)
        lib.pn_transport_push(target, buffer, size)
        return True

    def send(self, payload: bytes, *, tag: int | bytes = 1, settled: bool = False) -> int:
        dptr = amqp_hotpath.send(_address(self.sender), tag, payload, settled)
        self.pump()
        return dptr


def test_a_complete_transfer_comes_back_received_and_advanced():
    pair = _Pair()
    sent = pair.send(b"hello")
    records = pair.server.records()
    assert len(records) == 1
    kind, link, delivery, payload = records[0]
    assert (kind, link, payload) == (amqp_hotpath.TRANSFER, _address(pair.receiver), b"hello")
    assert delivery != 0
    assert sent != 0
    # Received and advanced: the link has nothing current, the delivery is ours to settle.
    assert lib.pn_link_current(pair.receiver) == ffi.NULL
    assert not lib.pn_delivery_settled(ffi.cast("pn_delivery_t *", delivery))


def test_a_settled_outcome_reaches_the_sender_as_its_state():
    pair = _Pair()
    sent = pair.send(b"x")
    (_, _, delivery, _) = pair.server.records()[0]
    amqp_hotpath.settle(delivery, lib.PN_REJECTED)
    pair.pump()
    outcomes = [r for r in pair.client.records() if r[0] == amqp_hotpath.OUTCOME]
    assert outcomes == [(amqp_hotpath.OUTCOME, sent, lib.PN_REJECTED)]


def test_a_pre_settled_transfer_is_settled_on_arrival_and_carries_no_delivery():
    pair = _Pair(settled=True)
    assert pair.send(b"fire and forget", settled=True) == 0
    assert pair.server.records() == [
        (amqp_hotpath.TRANSFER, _address(pair.receiver), 0, b"fire and forget")
    ]
    assert lib.pn_link_unsettled(pair.receiver) == 0


def test_deliveries_keep_their_order_tags_and_empty_bodies():
    pair = _Pair()
    pair.send(b"one", tag=1)
    pair.send(b"", tag=b"custom-tag")
    pair.send(b"three", tag=3)
    records = pair.server.records()
    assert [r[3] for r in records] == [b"one", b"", b"three"]
    tag = lib.pn_delivery_tag(ffi.cast("pn_delivery_t *", records[1][2]))
    assert ffi.unpack(tag.start, tag.size) == b"custom-tag"


def test_a_large_message_comes_as_partials_then_one_whole_payload():
    pair = _Pair(max_frame=512)
    body = os.urandom(200_000)
    amqp_hotpath.send(_address(pair.sender), 1, body, False)
    records = []
    while pair._move(pair.client.transport, pair.server.transport):
        records += pair.server.records()
    kinds = [r[0] for r in records]
    assert kinds[-1] == amqp_hotpath.TRANSFER
    assert set(kinds[:-1]) == {amqp_hotpath.PARTIAL}
    assert records[-1][3] == body
    sizes = [r[2] for r in records[:-1]]
    assert sizes == sorted(sizes)
    assert 0 < sizes[0] < len(body)


def test_an_aborted_delivery_is_dropped_and_the_next_one_arrives():
    pair = _Pair()
    sender = pair.sender
    dptr = lib.pn_delivery(sender, (2, ffi.from_buffer(b"t1")))
    lib.pn_link_send(sender, b"half a mess", 11)
    pair.pump()
    partial = pair.server.records()
    assert partial == [(amqp_hotpath.PARTIAL, _address(pair.receiver), 11)]
    lib.pn_delivery_abort(dptr)
    pair.pump()
    assert pair.server.records() == []
    pair.send(b"whole", tag=2)
    assert [r[3] for r in pair.server.records()] == [b"whole"]


def test_flow_reaches_the_sender_as_a_link_event_and_credit_reads_it():
    pair = _Pair(credit=0)
    assert amqp_hotpath.credit(_address(pair.sender)) == 0
    lib.pn_link_flow(pair.receiver, 5)
    pair.pump()
    records = pair.client.records()
    assert (lib.PN_LINK_FLOW, _address(pair.client.connection), _address(pair.sender)) in records
    assert amqp_hotpath.credit(_address(pair.sender)) == 5


def test_read_and_write_report_the_socket_state():
    pair = _Pair()
    ours, theirs = socket.socketpair()
    try:
        amqp_hotpath.send(_address(pair.sender), 1, b"over a socket", False)
        transport, server_transport = (
            _address(pair.client.transport),
            _address(pair.server.transport),
        )
        assert amqp_hotpath.write(transport, ours.fileno()) == amqp_hotpath.WRITE_DONE
        got, status = amqp_hotpath.read(server_transport, theirs.fileno(), 8)
        assert got > 0
        assert status == amqp_hotpath.READ_AGAIN
        assert [r[3] for r in pair.server.records()] == [b"over a socket"]
        ours.close()
        assert amqp_hotpath.read(server_transport, theirs.fileno(), 8) == (0, amqp_hotpath.READ_EOF)
    finally:
        theirs.close()
        ours.close()


def test_write_to_a_closed_socket_returns_the_errno():
    pair = _Pair()
    ours, theirs = socket.socketpair()
    theirs.close()
    amqp_hotpath.send(_address(pair.sender), 1, b"nobody listens", False)
    try:
        assert amqp_hotpath.write(_address(pair.client.transport), ours.fileno()) == 32  # EPIPE
    finally:
        ours.close()


def test_calls_before_bind_are_a_clear_error():
    done = subprocess.run(
        [sys.executable, "-c", "from enmasse import amqp_hotpath as h; h.credit(1)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "RuntimeError: amqp_hotpath: bind() was not called" in done.stderr


def test_bind_refuses_a_missing_function():
    with pytest.raises(KeyError, match="no address for pn_collector_peek"):
        amqp_hotpath.bind({}, [])
