"""The inter-router port with a mesh secret, with real router processes: a stranger is refused
with amqp:unauthorized-access and changes nothing; routers sharing the secret form a mesh and
forward; a router with the wrong secret stays out while the others keep working."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition, Outcome

from tests.fixtures.router import RouterFleet, RouterProcess

ADDRESSES = {"work": "anycast", "jobs": "anycast"}


def _secret_file(folder: Path, name: str, value: str) -> Path:
    path = folder / name
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    return _secret_file(tmp_path, "mesh-secret", "the-space-secret")


def _start(routers: RouterFleet, router_id: str, secret: Path) -> RouterProcess:
    return routers.start(router_id, extra_args=(f"--mesh-secret-file={secret}",))


def _forwards(
    sender_at: RouterProcess,
    receiver_at: RouterProcess,
    connect: Callable[..., Client],
    *,
    address: str = "work",
) -> None:
    """A message sent at one router reaches the only consumer, at the other, and is accepted."""
    consumer = connect(receiver_at.amqp_port).receiver(address, credit=10)
    deadline = time.monotonic() + 10
    while _remote_consumers(sender_at, address) < 1:
        assert time.monotonic() < deadline, "the consumer was never advertised"
        time.sleep(0.02)
    body = f"{sender_at.router_id}->{receiver_at.router_id}".encode()
    sent = connect(sender_at.amqp_port).sender(address).send_async(codec.encode_message(body))
    delivery = consumer.receive(10)
    consumer.accept(delivery)
    assert codec.read_body(delivery.payload) == body
    assert sent.result(10).outcome is Outcome.ACCEPTED


def _remote_consumers(router: RouterProcess, address: str) -> int:
    stats = router.address_stats(address)
    return stats.remote_consumers if stats is not None else 0


def _refusal(port: int, **login: str | None) -> Condition | None:
    """How the router turned a connection away: in the SASL exchange, or by closing it at open."""
    try:
        client = Client("127.0.0.1", port, **login)  # type: ignore[arg-type]
    except AmqpError as refused:
        return refused.condition
    try:
        return client.closed_with.result(10)
    finally:
        client.close()


def test_a_stranger_on_the_mesh_port_is_refused(
    routers: RouterFleet, secret: Path, amqp_client: Callable[..., Client]
) -> None:
    r1, r2 = _start(routers, "r1", secret), _start(routers, "r2", secret)
    routers.apply_all(routers.mesh_config(generation=1, addresses=ADDRESSES))
    routers.wait_for_mesh()
    before = [(c.role, c.container_id, c.user) for c in r1.stats().connections]
    assert _refusal(r1.inter_router_port, container_id="r3") == Condition(
        "amqp:unauthorized-access", "Authentication failed [mech=none]"
    )
    for password in ("guess", ""):
        refused = _refusal(r1.inter_router_port, container_id="r3", user="r3", password=password)
        assert refused == Condition(
            "amqp:unauthorized-access", "Authentication failed [mech=PLAIN]"
        )
    # The secret with another router's id: the login is right, the identity is not.
    impostor = _refusal(
        r1.inter_router_port, container_id="r9", user="r2x", password="the-space-secret"
    )
    assert impostor == Condition(
        "amqp:unauthorized-access", "logged in as router 'r2x' but opened as 'r9'"
    )
    assert [(c.role, c.container_id, c.user) for c in r1.stats().connections] == before
    assert before == [("inter-router", "r2", "r2")], "r2 dialled r1 and logged in as itself"
    assert sorted(r1.stats().reachable_routers) == ["r2"]
    _forwards(r2, r1, amqp_client)


def test_routers_sharing_the_secret_mesh_and_forward(
    routers: RouterFleet, secret: Path, amqp_client: Callable[..., Client]
) -> None:
    r1, r2, r3 = (_start(routers, r, secret) for r in ("r1", "r2", "r3"))
    routers.apply_all(routers.mesh_config(generation=1, addresses=ADDRESSES))
    routers.wait_for_mesh()
    _forwards(r3, r1, amqp_client)
    _forwards(r1, r2, amqp_client, address="jobs")


def _log_lines(router: RouterProcess, event: str) -> list[dict[str, object]]:
    lines = (json.loads(x) for x in router.log_path.read_text().splitlines() if x.startswith("{"))
    return [line for line in lines if line.get("event") == event]


def test_a_router_with_the_wrong_secret_does_not_join(
    routers: RouterFleet, secret: Path, tmp_path: Path, amqp_client: Callable[..., Client]
) -> None:
    wrong = _secret_file(tmp_path, "other-secret", "not-the-space-secret")
    r1, r2 = _start(routers, "r1", secret), _start(routers, "r2", secret)
    # r3 dials both (the greater id dials) and is refused by both.
    r3 = _start(routers, "r3", wrong)
    routers.apply_all(routers.mesh_config(generation=1, addresses=ADDRESSES))
    deadline = time.monotonic() + 15
    while {str(x.get("peer")) for x in _log_lines(r3, "inter-router login refused")} != {
        "r1",
        "r2",
    }:
        assert time.monotonic() < deadline, r3.log_path.read_text()[-2000:]
        time.sleep(0.05)
    refused_at_r1 = _log_lines(r1, "inter-router login refused")
    assert refused_at_r1, "r1 says it turned a peer away"
    assert refused_at_r1[0]["error"] == "Authentication failed [mech=PLAIN]"
    assert r3.stats().reachable_routers == []
    assert [c.container_id for c in r1.stats().connections] == ["r2"]
    assert sorted(r1.stats().reachable_routers) == ["r2"]
    assert sorted(r2.stats().reachable_routers) == ["r1"]
    _forwards(r2, r1, amqp_client)
