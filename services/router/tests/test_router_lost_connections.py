"""The router's connection notices for the will service (`lost_connections.py`), with a real router
process and real AMQP clients: a listener on `$lwt` gets one notice per ended client connection
that had attached a sender to the will queue (`mqtt/wills`), naming its container id and whether
it closed cleanly (a SIGKILLed client: not clean); a connection that never attached there gives
none; notices of connections that ended while nobody listened wait for the first listener; and
only a connection with full access may listen (a restricted user is refused with
amqp:unauthorized-access)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client, Receiver
from enmasse.amqp.engine import Condition
from enmasse.common.passwords import hash_password
from enmasse.resources.contracts import LOST_CONNECTIONS, WILL_ADDRESS
from enmasse.v1 import router_pb2

from tests.fixtures.router import RouterFleet, RouterProcess

PASSWORD = "secret"

# A client that attaches a sender to the will queue, then waits to be SIGKILLed.
REGISTERED_CLIENT = """
import sys, time
from enmasse.amqp.client import Client
client = Client("127.0.0.1", int(sys.argv[1]), container_id=sys.argv[2])
client.sender(sys.argv[3])
print("attached", flush=True)
time.sleep(600)
"""


@pytest.fixture
def router(routers: RouterFleet) -> RouterProcess:
    started = routers.start("r1", extra_args=("--client-auth=optional",))
    started.apply(
        router_pb2.RouterConfig(
            generation=1,
            space="iot",
            addresses=[
                router_pb2.AddressRoute(address=a, type="anycast") for a in (WILL_ADDRESS, "other")
            ],
            users=[
                router_pb2.RouterUser(
                    username="device",
                    password_hash=hash_password(PASSWORD),
                    authorization=[
                        router_pb2.RouterRule(addresses=["mqtt/#"], operations=["send", "recv"])
                    ],
                )
            ],
        )
    )
    return started


def _notice(listener: Receiver) -> tuple[str, bool]:
    delivery = listener.receive(10)
    properties = codec.read_application_properties(delivery.payload)
    return properties["container"], properties["clean"]


def test_a_listener_hears_of_clean_and_lost_connections_that_registered_a_will(
    router: RouterProcess, amqp_client: Callable[..., Client]
) -> None:
    listener = amqp_client(router.amqp_port).receiver(LOST_CONNECTIONS, credit=10)
    with Client("127.0.0.1", router.amqp_port, container_id="never-registered") as other:
        other.sender("other")
    with Client("127.0.0.1", router.amqp_port, container_id="leaves-cleanly") as leaving:
        leaving.sender(WILL_ADDRESS)
    assert _notice(listener) == ("leaves-cleanly", True)
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            REGISTERED_CLIENT,
            str(router.amqp_port),
            "gets-killed",
            WILL_ADDRESS,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "attached"
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait(10)
    assert _notice(listener) == ("gets-killed", False)


def test_notices_wait_for_the_first_listener(
    router: RouterProcess, amqp_client: Callable[..., Client]
) -> None:
    with Client("127.0.0.1", router.amqp_port, container_id="before-anyone-listened") as early:
        early.sender(WILL_ADDRESS)
    listener = amqp_client(router.amqp_port).receiver(LOST_CONNECTIONS, credit=10)
    assert _notice(listener) == ("before-anyone-listened", True)


def test_a_restricted_user_may_not_listen(
    router: RouterProcess, amqp_client: Callable[..., Client]
) -> None:
    user = amqp_client(router.amqp_port, user="device", password=PASSWORD)
    with pytest.raises(AmqpError) as refused:
        user.receiver(LOST_CONNECTIONS, credit=10)
    assert refused.value.condition == Condition(
        "amqp:unauthorized-access", "user 'device' may not receive from '$lwt'"
    )
