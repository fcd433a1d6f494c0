"""The inter-router mesh over mutual TLS, with real router processes (issue #15, item 3).

Routers holding a certificate of the space's CA (`--tls-dir`) and the space's secret mesh and
forward. A router with a certificate of another CA, or with none, stays out whichever side of the
connection it is on (the greater router id dials), and the routers that turned it away log who
and why while keeping their own mesh. On the TLS mesh port a plaintext client, a client without
a certificate and one with a certificate of another CA are refused in the handshake; a client
with a good certificate still has to log in with the secret (the second factor) and open as the
router it logged in as.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition, Outcome, Tls
from enmasse.amqp.tls import mutual_tls
from enmasse.common.certificates import CONTROL_PLANE, DATA_PLANE, TlsFiles

from tests.fixtures.certificates import issue
from tests.fixtures.router import RouterFleet, RouterProcess

ADDRESSES = {"work": "anycast", "jobs": "anycast"}
SECRET = "the-space-secret"
FRAMING = "amqp:connection:framing-error"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "mesh-secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


def _ours(tmp_path: Path, name: str) -> TlsFiles:
    return issue(tmp_path / "pki", ca="ours", name=name, role=DATA_PLANE)


def _stranger(tmp_path: Path, name: str) -> TlsFiles:
    """A router certificate of another CA, whose holder trusts our CA too (ca.crt is public):
    only its own certificate is wrong."""
    files = issue(tmp_path / "pki", ca="theirs", name=name, role=DATA_PLANE)
    ours = _ours(tmp_path, "any").ca.read_bytes()
    files.ca.write_bytes(ours + files.ca.read_bytes())
    return files


def _start(
    routers: RouterFleet, router_id: str, *, secret: Path, tls: TlsFiles | None
) -> RouterProcess:
    args = [f"--mesh-secret-file={secret}"]
    admin = None
    if tls is not None:
        args += ["--tls-dir", str(tls.directory)]
        # RouterAdmin takes a control-plane certificate of the router's own CA.
        pki, ca = tls.directory.parent.parent, tls.directory.parent.name
        admin = issue(pki, ca=ca, name="agent", role=CONTROL_PLANE)
    return routers.start(router_id, extra_args=tuple(args), admin_tls=admin)


def _apply(routers: RouterFleet, *members: RouterProcess) -> None:
    """Every router of the fleet is a peer of each of `members` (the others get no config)."""
    config = routers.mesh_config(generation=1, addresses=ADDRESSES)
    for router in members:
        router.apply(config)


def _wait_for_mesh(*members: RouterProcess) -> None:
    ids = sorted(r.router_id for r in members)
    deadline = time.monotonic() + 15
    while True:
        views = {r.router_id: sorted(r.stats().reachable_routers) for r in members}
        if all(views[r] == [o for o in ids if o != r] for r in ids):
            return
        assert time.monotonic() < deadline, f"mesh did not converge: {views}"
        time.sleep(0.05)


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
    while (stats := sender_at.address_stats(address)) is None or stats.remote_consumers < 1:
        assert time.monotonic() < deadline, "the consumer was never advertised"
        time.sleep(0.02)
    body = f"{sender_at.router_id}->{receiver_at.router_id}".encode()
    sent = connect(sender_at.amqp_port).sender(address).send_async(codec.encode_message(body))
    delivery = consumer.receive(10)
    consumer.accept(delivery)
    assert codec.read_body(delivery.payload) == body
    assert sent.result(10).outcome is Outcome.ACCEPTED


def _log_lines(router: RouterProcess, event: str) -> list[dict[str, object]]:
    lines = (json.loads(x) for x in router.log_path.read_text().splitlines() if x.startswith("{"))
    return [line for line in lines if line.get("event") == event]


def _logged(
    router: RouterProcess, event: str, *, where: Callable[[dict[str, object]], bool]
) -> dict[str, object]:
    """The first `event` line of the router's log that `where` picks, waiting for it (bounded)."""
    deadline = time.monotonic() + 15
    while True:
        found = [line for line in _log_lines(router, event) if where(line)]
        if found:
            return found[0]
        assert time.monotonic() < deadline, (event, router.log_path.read_text()[-3000:])
        time.sleep(0.05)


def _refusal(port: int, **options: object) -> Condition | None:
    """How the mesh port turned a client away: in the handshake or the SASL exchange, or by
    closing the connection at open."""
    try:
        client = Client("127.0.0.1", port, **options)  # type: ignore[arg-type]
    except AmqpError as refused:
        return refused.condition
    try:
        return client.closed_with.result(10)
    finally:
        client.close()


def test_routers_with_the_spaces_certificates_mesh_and_forward(
    routers: RouterFleet, secret: Path, tmp_path: Path, amqp_client: Callable[..., Client]
) -> None:
    members = [
        _start(routers, r, secret=secret, tls=_ours(tmp_path, r)) for r in ("r1", "r2", "r3")
    ]
    _apply(routers, *members)
    _wait_for_mesh(*members)
    r1, r2, r3 = members
    _forwards(r3, r1, amqp_client)
    _forwards(r1, r2, amqp_client, address="jobs")
    for router in members:
        assert not _log_lines(router, "inter-router connection refused"), router.router_id
        assert not _log_lines(router, "inter-router login refused"), router.router_id


@pytest.mark.parametrize("stranger", ["another CA", "no certificate"])
def test_a_router_without_the_spaces_certificate_stays_out_on_either_side(
    routers: RouterFleet,
    secret: Path,
    tmp_path: Path,
    amqp_client: Callable[..., Client],
    stranger: str,
) -> None:
    """r0 listens (r1 and r2 dial it), r3 dials (r1 and r2 listen); both know the secret."""

    def outsider(router_id: str) -> TlsFiles | None:
        return _stranger(tmp_path, router_id) if stranger == "another CA" else None

    r0 = _start(routers, "r0", secret=secret, tls=outsider("r0"))
    r1, r2 = (_start(routers, r, secret=secret, tls=_ours(tmp_path, r)) for r in ("r1", "r2"))
    r3 = _start(routers, "r3", secret=secret, tls=outsider("r3"))
    _apply(routers, r0, r1, r2, r3)
    for router in (r1, r2):
        # As the listener: r3's dial never gets through the handshake.
        dialled = _logged(
            router,
            "inter-router connection refused",
            where=lambda line: str(line["peer"]).startswith("127.0.0.1:"),
        )
        assert dialled["condition"] == FRAMING
        # Which of the TLS layer's words come first depends on when the peer hangs up.
        assert str(dialled["error"]).startswith(("TLS handshake failed: ", "TLS failed: ")), dialled
        expected = (
            "certificate verify failed" if stranger == "another CA" else "wrong version number"
        )
        assert expected in str(dialled["error"]), dialled
        # As the dialler: r0 is not a router whose certificate our CA signed.
        dialling = _logged(
            router, "inter-router connection refused", where=lambda line: line["peer"] == "r0"
        )
        assert dialling["condition"] == FRAMING, dialling
        if stranger == "another CA":
            assert "certificate verify failed" in str(dialling["error"]), dialling
    _wait_for_mesh(r1, r2)
    for outside in (r0, r3):  # (two strangers of one CA may mesh with each other)
        assert not {"r1", "r2"} & set(outside.stats().reachable_routers)
    for router in (r1, r2):
        assert [c.container_id for c in router.stats().connections] == (
            ["r2"] if router is r1 else ["r1"]
        )
    _forwards(r2, r1, amqp_client)


def test_the_tls_mesh_port_refuses_strangers_and_still_checks_the_secret(
    routers: RouterFleet, secret: Path, tmp_path: Path, amqp_client: Callable[..., Client]
) -> None:
    r1, r2 = (_start(routers, r, secret=secret, tls=_ours(tmp_path, r)) for r in ("r1", "r2"))
    _apply(routers, r1, r2)
    _wait_for_mesh(r1, r2)
    before = [(c.role, c.container_id, c.user) for c in r1.stats().connections]
    assert before == [("inter-router", "r2", "r2")], "r2 dialled r1 and logged in as itself"
    port = r1.inter_router_port
    login = {"container_id": "r9", "user": "r9", "password": SECRET}
    good = mutual_tls(_ours(tmp_path, "r9"))

    plaintext = _refusal(port, **login)
    assert plaintext is not None
    assert plaintext.name == FRAMING, plaintext
    no_certificate = _refusal(port, tls=Tls(ca_file=good.ca_file), **login)
    assert no_certificate is not None
    assert no_certificate.name == FRAMING, no_certificate
    assert "certificate required" in no_certificate.description
    foreign = _refusal(port, tls=mutual_tls(_stranger(tmp_path, "r9")), **login)
    assert foreign is not None
    assert foreign.name == FRAMING, foreign
    assert "unknown ca" in foreign.description

    def reasons() -> list[str]:
        lines = _log_lines(r1, "inter-router connection refused")
        return sorted(str(x["error"]) for x in lines if str(x["peer"]).startswith("127.0.0.1:"))

    deadline = time.monotonic() + 15
    while len(reasons()) < 3:  # the client may hear of its refusal before r1 has logged it
        assert time.monotonic() < deadline, reasons()
        time.sleep(0.05)
    assert reasons()[0].startswith("TLS handshake failed: certificate verify failed: ")
    assert reasons()[1:] == [
        "TLS handshake failed: peer did not return a certificate",
        "TLS handshake failed: wrong version number",
    ]

    # Inside the TLS the secret is the second factor, and the identity must match the login.
    wrong_secret = _refusal(port, tls=good, **{**login, "password": "guess"})
    assert wrong_secret == Condition(
        "amqp:unauthorized-access", "Authentication failed [mech=PLAIN]"
    )
    impostor = _refusal(port, tls=good, **{**login, "user": "r2x"})
    assert impostor == Condition(
        "amqp:unauthorized-access", "logged in as router 'r2x' but opened as 'r9'"
    )
    turned_away = _logged(r1, "inter-router login refused", where=lambda line: True)
    assert turned_away["error"] == "Authentication failed [mech=PLAIN]"
    named = _logged(r1, "inter-router login refused", where=lambda line: line["peer"] == "r9")
    assert named["user"] == "r2x", named

    assert [(c.role, c.container_id, c.user) for c in r1.stats().connections] == before
    assert sorted(r1.stats().reachable_routers) == ["r2"]
    _forwards(r2, r1, amqp_client)
