"""The MQTT gateway's store identity at a real router process (`contracts.MQTT_STORE_USER`, as
the router-agent pushes it: `enmasse.resources.mqtt_stores.store_identity`), with real AMQP
clients logging in with SCRAM.

It may listen on `$lwt` (the will service hears which clients that registered a will are gone),
which a tenant's user with rules on the store queues may not; it reads and writes the store
queues; it sends anywhere (a will goes to its client's topic) but receives from nothing else.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from enmasse.amqp import codec, sasl
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition, Outcome
from enmasse.common.passwords import hash_password, scram_credentials
from enmasse.resources.contracts import (
    LOST_CONNECTIONS,
    MQTT_STORE_USER,
    RETAINED_ADDRESS,
    WILL_ADDRESS,
)
from enmasse.resources.mqtt_stores import store_identity
from enmasse.v1 import router_pb2

from tests.fixtures.router import RouterFleet, RouterProcess

STORE_PASSWORD, DEVICE_PASSWORD = "store-secret", "device-secret"


@pytest.fixture
def router(routers: RouterFleet) -> RouterProcess:
    started = routers.start("r1", extra_args=("--client-auth=required",))
    started.apply(
        router_pb2.RouterConfig(
            generation=1,
            space="iot",
            addresses=[
                router_pb2.AddressRoute(address=a, type="anycast")
                for a in (WILL_ADDRESS, RETAINED_ADDRESS, "alerts")
            ],
            users=[
                router_pb2.RouterUser(
                    username="device",
                    password_hash=hash_password(DEVICE_PASSWORD),
                    scram_credentials=scram_credentials(DEVICE_PASSWORD),
                    authorization=[
                        router_pb2.RouterRule(addresses=["mqtt/#"], operations=["send", "recv"])
                    ],
                ),
                store_identity(STORE_PASSWORD),
            ],
            allow_plain_without_tls=True,
        )
    )
    return started


def _store(router: RouterProcess, amqp_client: Callable[..., Client]) -> Client:
    return amqp_client(
        router.amqp_port,
        user=MQTT_STORE_USER,
        password=STORE_PASSWORD,
        mechanisms=sasl.CLIENT_MECHANISMS,
    )


def test_the_store_identity_listens_on_lwt_and_a_users_rules_on_the_stores_do_not(
    router: RouterProcess, amqp_client: Callable[..., Client]
) -> None:
    listener = _store(router, amqp_client).receiver(LOST_CONNECTIONS, credit=10)
    with Client(
        "127.0.0.1",
        router.amqp_port,
        container_id="amqp-device",
        user="device",
        password=DEVICE_PASSWORD,
        mechanisms=sasl.CLIENT_MECHANISMS,
    ) as device:
        device.sender(WILL_ADDRESS)
        with pytest.raises(AmqpError) as refused:
            device.receiver(LOST_CONNECTIONS, credit=10)
    assert refused.value.condition == Condition(
        "amqp:unauthorized-access", "user 'device' may not receive from '$lwt'"
    )
    properties = codec.read_application_properties(listener.receive(10).payload)
    assert (properties["container"], properties["clean"]) == ("amqp-device", True)


def test_the_store_identity_uses_its_queues_sends_anywhere_and_receives_nowhere_else(
    router: RouterProcess, amqp_client: Callable[..., Client]
) -> None:
    store = _store(router, amqp_client)
    kept = store.receiver(RETAINED_ADDRESS, credit=1)
    sent = (
        _store(router, amqp_client).sender(RETAINED_ADDRESS).send_async(codec.encode_message("on"))
    )
    delivery = kept.receive(10)
    kept.accept(delivery)
    assert codec.read_body(delivery.payload) == "on"
    assert sent.result(10).outcome is Outcome.ACCEPTED
    alerts = amqp_client(
        router.amqp_port, user="device", password=DEVICE_PASSWORD, mechanisms=sasl.CLIENT_MECHANISMS
    )
    with pytest.raises(AmqpError) as refused:
        alerts.receiver("alerts", credit=1)  # the device may not: only its store queues
    with pytest.raises(AmqpError) as not_the_stores:
        store.receiver("alerts", credit=1)
    assert not_the_stores.value.condition == Condition(
        "amqp:unauthorized-access", f"user '{MQTT_STORE_USER}' may not recv from 'alerts'"
    )
    assert refused.value.condition == Condition(
        "amqp:unauthorized-access", "user 'device' may not recv from 'alerts'"
    )
    store.sender("alerts")  # a will's topic: attached without a refusal
