"""The broker holds addresses to the config service's rule (`validation.address_problem`).

A real `enmasse-broker` process: EnsureQueue refuses what the API would have refused (so nothing
the API accepted can go Failed here for its name), and a client attaching straight to the broker
(a brokered space's clients do) with a bad address gets its link refused with
`amqp:invalid-field` and the reason, while its connection stays up and serves the next link.
`<topic>::<name>` stays what it is on a broker: a subscription queue's name.
"""
# ruff: noqa: E501  (the exact messages read best on one line each)

from __future__ import annotations

import grpc
import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Outcome

from tests.fixtures.broker import BrokerProcess

RESERVED = "(reserved for the router network and the control plane)"
BAD = [
    ("a..b", "'a..b' has an empty segment (segments are separated by '/' and '.')"),
    ("a\x00b", "'a\\x00b' must not contain control characters"),
    ("ordérs", "'ord\\xe9rs' must hold ASCII characters only"),
    ("_dynamic/x", f"'_dynamic/x' must not start with '_dynamic/' {RESERVED}"),
    ("_mesh/x", f"'_mesh/x' must not start with '_mesh/' {RESERVED}"),
    ("$x", f"'$x' must not start with '$' {RESERVED}"),
    ("x" * 256, "must be at most 255 characters (got 256)"),
    ("prices::", "'prices::' names no subscription after '::'"),
]


def test_ensure_queue_refuses_what_the_api_refuses(broker: BrokerProcess) -> None:
    for name, expected in [
        *BAD[:-1],
        (
            "a::b",
            "'a::b' must not contain '::', which is reserved for subscriptions (<topic>::<name> on a broker)",
        ),
    ]:
        for ensure in (broker.ensure_queue, broker.ensure_topic):
            with pytest.raises(grpc.RpcError) as caught:
                ensure(name)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details() == f"address name is invalid: {expected}"
    assert broker.addresses() == {}


def test_an_attach_to_a_bad_address_is_refused_and_the_connection_stays(
    broker: BrokerProcess,
) -> None:
    broker.ensure_queue("orders")
    broker.ensure_topic("prices")
    with Client("127.0.0.1", broker.amqp_port) as client:
        # A NUL cannot be tested here: proton hands addresses over as C strings, so the engine
        # (ours, the client's) reads "a\x00b" as "a". EnsureQueue above refuses it.
        for address, expected in [(a, e) for a, e in BAD if "\x00" not in a]:
            for attach in (client.sender, client.receiver):
                with pytest.raises(AmqpError) as refused:
                    attach(address)
                condition = refused.value.condition
                assert condition is not None
                assert condition.name == "amqp:invalid-field"
                assert condition.description == f"address is invalid: {expected}"
        # The same connection goes on: a good queue, and a topic's subscription queue by name.
        sender = client.sender("orders")
        assert sender.send(codec.encode_message("still here")).outcome == Outcome.ACCEPTED
        assert codec.read_body(client.receiver("orders").receive().payload) == "still here"
        with pytest.raises(AmqpError, match="amqp:not-found"):
            client.receiver("prices::nobody")  # a well-formed name: looked up, not refused
