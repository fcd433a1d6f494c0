"""Issue #15's test matrix in one place: who may do what, on a whole `enmasse up` stack.

One stack for the module (`running`: supervisord, etcd over mutual TLS, config with auth on,
storage-controller, router-agent, subscription, then routers and brokers as spaces are applied),
set up the way the README tells a tenant to: the admin applies three address spaces and hands out
tokens (CreateToken, as `enmasse token create` does); the tenant `acme` applies, with its own
token and `enmasse apply`, its addresses and MessagingUsers; the tenant `globex` its own. Then
every cell of three tables, each a parametrized case built from the data below, asserts the exact
outcome a client sees:

- MESSAGE_PLANE: identity x operation on a space's client endpoint (the standard space `acme`'s
  router, the brokered space `acme-jms`'s broker): the message arrived, or the exact
  amqp:unauthorized-access refusal (at the link, the connection staying up; per message on an
  anonymous-relay link, the link staying up), or the login refused in SASL.
- ADMIN_API: token x ConfigService call (list, get, create, delete, watch of addresses) in the
  token's own space and in another: OK, or the exact gRPC code and message. Every caller connects
  as a tenant does: TLS verified against the published var/tls/ca.crt, no client certificate.
- TRANSPORT: who reaches which listener: a plaintext client, or one with a certificate of another
  CA, is refused on every mutual-TLS port (RouterAdmin, BrokerAdmin, etcd, the inter-router port,
  a standard space's broker behind its routers), and so is a tenant's channel (no certificate) on
  RouterAdmin; config takes no plaintext, and a certificate is no credential there (it asks for
  none: without a token, UNAUTHENTICATED); a router with another space's mesh secret is refused
  on the inter-router port, a plaintext client on either space's amqps endpoint (the standard
  space's router, the brokered space's broker), where a user logs in with SCRAM or PLAIN over TLS
  verifying the endpoint's name against var/tls/ca.crt; a control check in each group shows the
  right credentials get through, so no refusal is a broken client.

A cell where the system does not (yet) do what the issue asks is marked xfail(strict=True) with
the reason, so that it is seen, and flips to a failure the day it passes.

What the issue asks that is shown elsewhere (the map, so nothing is tested twice):
- the YAML bomb refused before it expands: libs/resources/tests/test_manifest_bounds.py
  (test_a_billion_laughs_is_refused_at_its_first_anchor), cli/tests/test_cli_validate_bounds.py
  (test_validate_refuses_a_billion_laughs_at_its_first_anchor), and through the GitOps sync
  services/config/tests/test_config_address_rule.py
  (test_a_bomb_in_one_tenants_directory_is_refused_and_the_others_apply);
- 1,000 wrong-password logins while a good client logs in: libs/amqp/tests/test_amqp_login_flood.py
  (test_a_flood_of_wrong_passwords_never_keeps_a_good_login_out); the back-off itself:
  libs/amqp/tests/test_amqp_throttle.py;
- a rule change reaching a live link: services/router/tests/test_router_authorization.py
  (test_a_rule_change_closes_the_links_that_lost_their_right);
- the mesh with and without the secret or the certificate, routers joining or not:
  services/router/tests/test_router_mesh_secret.py, test_router_mesh_tls.py; amqps and logins
  over it on one router: services/router/tests/test_router_client_access.py,
  libs/amqp/tests/test_amqp_tls_sasl.py; the brokered broker's access on its own:
  services/broker/tests/test_broker_client_access.py;
- RouterAdmin, BrokerAdmin and etcd certificate roles on their own:
  tests/test_transport_security.py; the operator's read-only certificate there, and config
  reached with a token and the CA certificate alone (by the CLI too):
  tests/test_admin_identities.py;
  keys of mode 0600, tokens per service, `enmasse send/receive` over amqps:
  tests/test_e2e_local_tls.py, tests/test_e2e_local_auth.py;
- the admin API's matrix on one config process, roles and token records: services/config/tests/
  test_config_auth.py, test_config_access.py; `enmasse token`: cli/tests/test_cli_tokens.py;
- limits (connections, sessions, links, message size): services/router/tests/
  test_router_admin_and_limits.py, services/router-agent/tests/test_router_agent_limits.py;
- address strings held to one rule: services/config/tests/test_config_address_rule.py,
  services/broker/tests/test_broker_address_rule.py; the audit log: services/config/tests/
  test_config_audit.py.

Speed: one stack, the spaces applied at once, bounded waits only (readiness asked of the routers
themselves); a refused login is tried once per endpoint, since the router's login throttle would
slow every later login from this host, and it is the same refusal whatever the client meant to do.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from enmasse.amqp import codec, sasl
from enmasse.amqp.client import AmqpError, Client, Receiver
from enmasse.amqp.engine import Condition, Delivery, Outcome, Terminus, Tls
from enmasse.amqp.tls import mutual_tls
from enmasse.common.certificates import (
    CONTROL_PLANE,
    Holder,
    TlsFiles,
    ensure_authority,
    ensure_certificate,
)
from enmasse.common.credentials import bearer_metadata, channel_credentials, verifying_credentials
from enmasse.resources.discovery import LocalDirectory
from enmasse.v1 import (
    broker_pb2,
    broker_pb2_grpc,
    config_pb2,
    config_pb2_grpc,
    resources_pb2,
    router_pb2,
    router_pb2_grpc,
)

from tests.fixtures.local_runtime import LocalRuntime, enmasse, running, wait_until

pytestmark = pytest.mark.slow
Attached = TypeVar("Attached")

# ================================================================ the stack the matrix runs on

ACME, ACME_JMS, GLOBEX = "acme", "acme-jms", "globex"  # acme's two spaces, another tenant's
PASSWORDS = {"sender": "send-pw", "reader": "read-pw", "ops": "ops-pw", "outsider": "gx-pw"}
WAIT = 10.0  # seconds: every call, attach and delivery the matrix waits for

SPACES = f"""
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {{name: {ACME}}}
spec: {{type: standard, plan: standard-small}}
---
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {{name: {ACME_JMS}}}
spec: {{type: brokered, plan: brokered-single}}
---
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {{name: {GLOBEX}}}
spec: {{type: standard, plan: standard-small}}
"""

# The addresses every operation below names, in both of acme's spaces (anycast through acme's
# router, queues on acme-jms's broker), and what each user's rules say.
ADDRESSES = {
    "pq": "pq",
    "pq2": "pq2",
    "orders-eu": "orders/eu",
    "sensors-temp": "sensors.temp",
    "sensors-temp-max": "sensors.temp.max",
}
RULES = {
    "sender": [{"addresses": ["pq"], "operations": ["send"]}],
    "reader": [{"addresses": ["orders/#", "sensors.*"], "operations": ["recv"]}],
    "ops": [{"addresses": ["#"], "operations": ["send", "recv"]}],  # the other end of each cell
}
JOBS = "jobs"  # a queue of acme's: a broker behind the router, which no client may reach


def _address(name: str, address: str, *, space: str, type_: str, plan: str) -> str:
    return f"""---
apiVersion: enmasse.io/v1
kind: Address
metadata: {{name: {name}, space: {space}}}
spec: {{address: '{address}', type: {type_}, plan: {plan}}}
"""


def _user(name: str, *, space: str, rules: list[dict[str, list[str]]]) -> str:
    return f"""---
apiVersion: enmasse.io/v1
kind: MessagingUser
metadata: {{name: {name}, space: {space}}}
spec:
  username: {name}
  password: {PASSWORDS[name]}
  authorization: {json.dumps(rules)}
"""


def _acme_manifests() -> str:
    """What acme's tenant-admin applies with its token: addresses and users of both its spaces."""
    parts = []
    for name, address in ADDRESSES.items():
        parts.append(_address(name, address, space=ACME, type_="anycast", plan="standard-anycast"))
        parts.append(_address(name, address, space=ACME_JMS, type_="queue", plan="brokered-queue"))
    parts.append(_address(JOBS, JOBS, space=ACME, type_="queue", plan="standard-small-queue"))
    for space in (ACME, ACME_JMS):
        parts.extend(_user(name, space=space, rules=rules) for name, rules in RULES.items())
    return "".join(parts)


def _globex_manifests() -> str:
    rules = RULES["ops"]
    return _address("pq", "pq", space=GLOBEX, type_="anycast", plan="standard-anycast") + _user(
        "outsider", space=GLOBEX, rules=rules
    )


# ================================================================ table 1: the message plane

RECEIVED = "received"  # the message (for a dynamic reply: the reply) arrived; the sender: accepted
LINK_REFUSED = "link refused"  # the attach refused; the connection stays up
REJECTED = "message rejected"  # one message of an anonymous-relay link rejected; the link stays
LOGIN_REFUSED = "login refused"  # the connection ends in SASL
UNAUTHORIZED = "amqp:unauthorized-access"
REPLY_BELONGS = "a reply address belongs to the connection that made it"


@dataclass(frozen=True)
class Seen:
    """What a client saw: one of the outcomes above, with the AMQP condition where it got one."""

    outcome: str
    condition: str = ""
    description: str = ""


def refused(description: str, *, condition: str = UNAUTHORIZED) -> Seen:
    return Seen(LINK_REFUSED, condition, description)


def rejected(description: str) -> Seen:
    return Seen(REJECTED, UNAUTHORIZED, description)


def login_refused(mechanism: str) -> Seen:
    return Seen(LOGIN_REFUSED, UNAUTHORIZED, f"Authentication failed [mech={mechanism}]")


@dataclass(frozen=True)
class Identity:
    user: str | None  # None: no user (SASL ANONYMOUS)
    password: str = ""


IDENTITIES = {
    "anonymous": Identity(None),
    "sender": Identity("sender", PASSWORDS["sender"]),  # send on pq only
    "reader": Identity("reader", PASSWORDS["reader"]),  # recv on orders/# and sensors.*
    "user of another space": Identity("outsider", PASSWORDS["outsider"]),  # globex's, with '#'
    "wrong password": Identity("sender", "not-the-password"),
}

# The operations, each on one address. `relay`: a sending link with no target, the message's
# `to` naming the address. `dynamic reply`: a dynamic receiver, then a request sent to pq with
# that reply address, answered by a responder (ops) listening on pq. `another's reply`: a receiver
# on the dynamic reply address another connection (ops) made; `{reply}` stands for it.
OPERATIONS = (
    "send pq",
    "send pq2",
    "recv pq",
    "recv orders/eu",
    "recv sensors.temp",
    "recv sensors.temp.max",
    "relay to pq",
    "relay to pq2",
    "dynamic reply",
    "recv another's reply",
)
NO_LOGIN = login_refused("none")  # no user, and the plan allows no ANONYMOUS
BAD_LOGIN = login_refused("SCRAM-SHA-512")  # the first mechanism the client takes


def _may_not(user: str, operation: str, address: str, why: str = "") -> Seen:
    direction = "to" if operation == "send" else "from"
    return refused(f"user '{user}' may not {operation} {direction} '{address}'" + why)


MESSAGE_PLANE: dict[str, dict[str, Seen]] = {
    "anonymous": dict.fromkeys(OPERATIONS, NO_LOGIN),
    "sender": {
        "send pq": Seen(RECEIVED),
        "send pq2": _may_not("sender", "send", "pq2"),
        "recv pq": _may_not("sender", "recv", "pq"),
        "recv orders/eu": _may_not("sender", "recv", "orders/eu"),
        "recv sensors.temp": _may_not("sender", "recv", "sensors.temp"),
        "recv sensors.temp.max": _may_not("sender", "recv", "sensors.temp.max"),
        "relay to pq": Seen(RECEIVED),
        "relay to pq2": rejected("user 'sender' may not send to 'pq2'"),
        "dynamic reply": Seen(RECEIVED),  # its reply address needs no recv rule
        "recv another's reply": _may_not("sender", "recv", "{reply}", f": {REPLY_BELONGS}"),
    },
    "reader": {
        "send pq": _may_not("reader", "send", "pq"),
        "send pq2": _may_not("reader", "send", "pq2"),
        "recv pq": _may_not("reader", "recv", "pq"),
        "recv orders/eu": Seen(RECEIVED),  # orders/#
        "recv sensors.temp": Seen(RECEIVED),  # sensors.*
        "recv sensors.temp.max": _may_not("reader", "recv", "sensors.temp.max"),  # * is 1 segment
        "relay to pq": rejected("user 'reader' may not send to 'pq'"),
        "relay to pq2": rejected("user 'reader' may not send to 'pq2'"),
        "dynamic reply": _may_not("reader", "send", "pq"),  # the request: no send rule
        "recv another's reply": _may_not("reader", "recv", "{reply}", f": {REPLY_BELONGS}"),
    },
    "user of another space": dict.fromkeys(OPERATIONS, BAD_LOGIN),
    "wrong password": dict.fromkeys(OPERATIONS, BAD_LOGIN),
}

# The brokered space's broker is that space's client endpoint: the same identities, the same
# rules, on queues. Its anonymous relay checks each `to` as a router's does, and its dynamic
# (temporary) queues behave as a router's dynamic reply addresses.
BROKERED_OPERATIONS = OPERATIONS[:-1]
BROKERED: dict[str, dict[str, Seen]] = {
    identity: {op: MESSAGE_PLANE[identity][op] for op in BROKERED_OPERATIONS}
    for identity in MESSAGE_PLANE
}

# ================================================================ table 2: the admin API

TOKEN_OPERATIONS = ("list", "get", "create", "delete", "watch")
RPCS = {
    "list": "ListAddresses",
    "get": "GetAddress",
    "create": "CreateAddress",
    "delete": "DeleteAddress",
    "watch": "Watch",
}
OK = ("OK", "")
NO_CREDENTIALS = "no credentials: call with the metadata 'authorization: Bearer <token>'"
BAD_TOKEN = "not-a-token-anybody-made"
TOKENS = {  # identity -> the token the admin makes for it: name, role, spaces, lifetime (s)
    "revoked": config_pb2.CreateTokenRequest(name="gone", role="tenant-admin", spaces=[ACME]),
    "expired": config_pb2.CreateTokenRequest(
        name="lapsed", role="tenant-admin", spaces=[ACME], expires_in_seconds=1
    ),
    "tenant-admin of acme": config_pb2.CreateTokenRequest(
        name="acme-team", role="tenant-admin", spaces=[ACME, ACME_JMS]
    ),
    "viewer of acme": config_pb2.CreateTokenRequest(
        name="acme-viewer", role="viewer", spaces=[ACME]
    ),
    "globex's tenant-admin": config_pb2.CreateTokenRequest(
        name="globex-team", role="tenant-admin", spaces=[GLOBEX]
    ),
}


def _denied(token: str, role: str, operation: str, space: str) -> tuple[str, str]:
    return (
        "PERMISSION_DENIED",
        f"token '{token}' ({role}) may not {RPCS[operation]} in address space '{space}'",
    )


def _admin_api() -> dict[tuple[str, str, str], tuple[str, str]]:
    """(identity, operation, space) -> (gRPC code, message); `{expired_at}` is the token's."""
    table: dict[tuple[str, str, str], tuple[str, str]] = {}
    tenant, viewer = "tenant-admin of acme, acme-jms", "viewer of acme"
    for operation, space in itertools.product(TOKEN_OPERATIONS, (ACME, GLOBEX)):
        reads = operation in ("list", "get", "watch")
        cells = {
            "no token": ("UNAUTHENTICATED", NO_CREDENTIALS),
            "bad token": ("UNAUTHENTICATED", "unknown token"),
            "revoked": ("UNAUTHENTICATED", "token 'gone' has been revoked"),
            "expired": ("UNAUTHENTICATED", "token 'lapsed' expired at {expired_at}"),
            "admin": OK,
            "tenant-admin of acme": (
                OK if space == ACME else _denied("acme-team", tenant, operation, space)
            ),
            "viewer of acme": (
                OK if space == ACME and reads else _denied("acme-viewer", viewer, operation, space)
            ),
        }
        for identity, outcome in cells.items():
            table[(identity, operation, space)] = outcome
    return table


ADMIN_API = _admin_api()

# ================================================================ table 3: transport

# A description of None: the TLS library's own words, which the cell does not compare.
UNAVAILABLE = ("UNAVAILABLE", None)  # gRPC: the handshake failed
ANSWERED = ("answered", None)
FRAMING = "amqp:connection:framing-error"
PLAIN_ON_TLS = "Expected SASL protocol header: no protocol header found (connection aborted)"
TRANSPORT: dict[tuple[str, str], tuple[str, str | None]] = {
    ("config", "a tenant's channel, with the admin token (control check)"): ANSWERED,
    ("config", "plaintext, with the admin token"): UNAVAILABLE,
    ("config", "a tenant's channel trusting another CA, with the admin token"): UNAVAILABLE,
    ("config", "a certificate of another CA, no token"): ("UNAUTHENTICATED", NO_CREDENTIALS),
    ("config", "the operator's certificate, no token"): ("UNAUTHENTICATED", NO_CREDENTIALS),
    ("acme's RouterAdmin", "the operator's certificate (control check)"): ANSWERED,
    ("acme's RouterAdmin", "plaintext"): UNAVAILABLE,
    ("acme's RouterAdmin", "a tenant's channel"): UNAVAILABLE,
    ("acme's RouterAdmin", "a certificate of another CA"): UNAVAILABLE,
    ("acme-jms's BrokerAdmin", "the operator's certificate (control check)"): ANSWERED,
    ("acme-jms's BrokerAdmin", "a tenant's channel"): UNAVAILABLE,
    ("acme-jms's BrokerAdmin", "a certificate of another CA"): UNAVAILABLE,
    ("etcd", "config's etcd certificate (control check)"): ANSWERED,
    ("etcd", "plaintext"): UNAVAILABLE,
    ("etcd", "the operator's certificate (not of etcd's CA)"): UNAVAILABLE,
    # The mesh: locally every router holds the same certificate, so the space's secret is what
    # keeps globex's routers out of acme's mesh.
    ("acme's inter-router port", "a router's certificate, globex's mesh secret"): (
        LOGIN_REFUSED,
        "Authentication failed [mech=PLAIN]",
    ),
    ("acme's inter-router port", "plaintext, globex's mesh secret"): (FRAMING, PLAIN_ON_TLS),
    ("acme's inter-router port", "a certificate of another CA, acme's mesh secret"): (
        FRAMING,
        None,
    ),
    ("acme's broker (behind the router)", "plaintext, no user"): (
        FRAMING,
        "Expected AMQP protocol header: no protocol header found (connection aborted)",
    ),
    ("acme's broker (behind the router)", "a certificate of another CA"): (FRAMING, None),
}
# Each space's client endpoint over TLS: the standard space's router, the brokered space's broker.
for _endpoint in ("acme's amqps endpoint", "acme-jms's amqps endpoint"):
    TRANSPORT.update(
        {
            (_endpoint, "sender, SCRAM over TLS trusting var/tls/ca.crt (control check)"): (
                "connected",
                None,
            ),
            (_endpoint, "sender, PLAIN over TLS trusting var/tls/ca.crt"): ("connected", None),
            (_endpoint, "plaintext"): (FRAMING, PLAIN_ON_TLS),  # as on the inter-router port
        }
    )
NOT_YET: dict[tuple[str, str], str] = {}  # (target, client) -> why the system does not do it yet

# ================================================================ the stack


@dataclass
class Stack:
    runtime: LocalRuntime
    config: config_pb2_grpc.ConfigServiceStub  # on one channel for the whole module
    secrets: dict[str, str]  # token identity -> secret
    expired_at: str
    refused_logins: dict[tuple[str, str], Seen] = field(default_factory=dict)
    bodies: Iterator[int] = field(default_factory=itertools.count)
    endpoints: dict[str, int] = field(default_factory=dict)

    @property
    def var(self) -> Path:
        return self.runtime.var

    def endpoint(self, space: str) -> int:
        """The space's `amqp` endpoint from its status, as a client finds it: router or broker."""
        if space not in self.endpoints:
            self.endpoints[space] = self.runtime.router_port(space)
        return self.endpoints[space]

    def amqps(self, space: str) -> int | None:
        """The space's `amqps` endpoint from its status; None when it shows none."""
        shown = self.runtime.address_space(space).status.endpoints
        return next((e.port for e in shown if e.name == "amqps"), None)

    def body(self) -> str:
        return f"matrix message {next(self.bodies)}"


def _users_on_the_routers(runtime: LocalRuntime, space: str, users: set[str]) -> bool:
    found = LocalDirectory(runtime.var)
    found.refresh()
    routers = found.routers(space)
    for router in routers:
        with runtime.channel(router.admin) as channel:
            stub = router_pb2_grpc.RouterAdminStub(channel)
            try:
                config = stub.GetConfig(router_pb2.GetConfigRequest(), timeout=5)
            except grpc.RpcError:
                return False
        if not users <= {u.username for u in config.users}:
            return False
    return bool(routers)


def _client_access_held(runtime: LocalRuntime, space: str) -> bool:
    """True when every broker of the (brokered) space holds a client access pushed to it."""
    found = LocalDirectory(runtime.var)
    found.refresh()
    brokers = found.brokers(space).values()
    for broker in brokers:
        with runtime.channel(broker.admin) as channel:
            stub = broker_pb2_grpc.BrokerAdminStub(channel)
            try:
                listing = stub.ListAddresses(broker_pb2.ListAddressesRequest(), timeout=5)
            except grpc.RpcError:
                return False
        if not listing.client_access_version:
            return False
    return bool(brokers)


def _tokens(config: config_pb2_grpc.ConfigServiceStub, admin: str) -> tuple[dict[str, str], str]:
    """The admin makes TOKENS and revokes one: (identity -> secret, when 'expired' expired)."""
    options = {"metadata": bearer_metadata(admin), "timeout": WAIT, "wait_for_ready": True}
    secrets = {
        identity: config.CreateToken(request, **options).secret
        for identity, request in TOKENS.items()
    }
    config.RevokeToken(config_pb2.RevokeTokenRequest(name=TOKENS["revoked"].name), **options)
    listed = config.ListTokens(config_pb2.ListTokensRequest(), **options)
    lapsed = next(t for t in listed.items if t.name == TOKENS["expired"].name).expires_at
    assert wait_until(lambda: time.time() > lapsed.ToNanoseconds() / 1e9, timeout=5)
    return secrets, lapsed.ToDatetime().isoformat(timespec="seconds") + "Z"


def _apply_as(runtime: LocalRuntime, token: str, text: str, *, name: str) -> None:
    """`enmasse --token TOKEN apply -f FILE`, as a tenant runs it; again (twice at most) when it
    found config unreachable, as a loaded machine's first connection sometimes does."""
    path = runtime.var.parent / name
    path.write_text(text)
    for _attempt in range(3):
        applied = enmasse(runtime.var, "--token", token, "apply", "-f", str(path))
        if not applied.stderr.startswith("error: cannot reach the config service"):
            break
    assert applied.returncode == 0, applied.stderr


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    var = tmp_path_factory.mktemp("security-matrix") / "var"
    with running(var) as runtime, runtime.config_channel() as channel:
        config = config_pb2_grpc.ConfigServiceStub(channel)
        # The admin applies the spaces and makes a token for each tenant (README: "Admin API
        # access (tokens)"), each tenant its addresses and users ("Tenants: users and logging in").
        admin = (runtime.var / "run" / "admin-token").read_text().strip()
        runtime.apply(SPACES, name="spaces.yaml")
        secrets, expired_at = _tokens(config, admin)
        secrets.update({"admin": admin, "bad token": BAD_TOKEN, "no token": ""})
        # Each tenant applies its addresses and users with its own token (both at once: each
        # `enmasse` is a process start of its own).
        tenants = (
            ("tenant-admin of acme", _acme_manifests(), "acme.yaml"),
            ("globex's tenant-admin", _globex_manifests(), "globex.yaml"),
        )
        with ThreadPoolExecutor(len(tenants)) as pool:
            applies = [
                pool.submit(_apply_as, runtime, secrets[who], text, name=name)
                for who, text, name in tenants
            ]
            for done in applies:
                done.result()
        runtime.wait_active(ACME, [*ADDRESSES, JOBS], timeout=120)
        runtime.wait_active(ACME_JMS, list(ADDRESSES), timeout=120)
        runtime.wait_active(GLOBEX, ["pq"], timeout=120)
        assert wait_until(lambda: _users_on_the_routers(runtime, ACME, set(RULES)), timeout=60)
        assert wait_until(lambda: _users_on_the_routers(runtime, GLOBEX, {"outsider"}), timeout=60)
        # The brokered space's users reach its broker in a push of their own; a broker that never
        # gets one is what the brokered rows then show.
        wait_until(lambda: _client_access_held(runtime, ACME_JMS), timeout=30)
        yield Stack(runtime=runtime, config=config, secrets=secrets, expired_at=expired_at)


# ================================================================ the message plane's cells


class Observed(Exception):
    """Ends an operation early with what the client saw (a refused login or attach)."""

    def __init__(self, seen: Seen) -> None:
        super().__init__(seen)
        self.seen = seen


def _login(stack: Stack, cleanup: ExitStack, *, space: str, identity: str) -> Client:
    """A fresh connection as `identity` to the space's endpoint; a refused login is tried once
    per endpoint (see the module's docstring) and raises Observed."""
    key = (space, identity)
    if key in stack.refused_logins:
        raise Observed(stack.refused_logins[key])
    who = IDENTITIES.get(identity) or Identity(identity, PASSWORDS[identity])  # "ops" too
    login = (
        {"user": who.user, "password": who.password, "mechanisms": sasl.CLIENT_MECHANISMS}
        if who.user
        else {}
    )
    try:
        client = Client("127.0.0.1", stack.endpoint(space), timeout=WAIT, **login)  # type: ignore[arg-type]
    except AmqpError as error:
        stack.refused_logins[key] = _seen(LOGIN_REFUSED, error.condition)
        raise Observed(stack.refused_logins[key]) from None
    cleanup.callback(client.close)
    return client


def _seen(outcome: str, condition: Condition | None) -> Seen:
    if condition is None:
        return Seen(outcome, "(no condition)")
    return Seen(outcome, condition.name, condition.description)


def _attach(client: Client, attach: Callable[[], Attached]) -> Attached:
    try:
        return attach()
    except AmqpError as error:
        outcome = LINK_REFUSED + (", connection closed" if client.closed_with.done() else "")
        raise Observed(_seen(outcome, error.condition)) from None


def _arrives(receiver: Receiver, body: str) -> Delivery | None:
    """The delivery of `body` at `receiver` (accepting any stale one before it), or None."""
    deadline = time.monotonic() + WAIT
    while (left := deadline - time.monotonic()) > 0:
        try:
            delivery = receiver.receive(left)
        except (TimeoutError, AmqpError):
            return None
        receiver.accept(delivery)
        if codec.read_body(delivery.payload) == body:
            return delivery
    return None


def _delivered(sent: Future[Delivery], receiver: Receiver, body: str) -> Seen:
    """RECEIVED when `body` reached `receiver` and its sender saw it accepted."""
    if _arrives(receiver, body) is None:
        return Seen("nothing arrived")
    return _delivered_and_accepted(sent)


def _delivered_and_accepted(sent: Future[Delivery]) -> Seen:
    delivery = sent.result(WAIT)
    if delivery.outcome is not Outcome.ACCEPTED:
        return _seen(f"arrived, but the sender saw {delivery.outcome}", delivery.error)
    return Seen(RECEIVED)


def _send(address: str) -> Callable[[Stack, str, str, ExitStack], Seen]:
    def run(stack: Stack, space: str, identity: str, cleanup: ExitStack) -> Seen:
        client = _login(stack, cleanup, space=space, identity=identity)
        consumer = _login(stack, cleanup, space=space, identity="ops").receiver(address)
        sender = _attach(client, lambda: client.sender(address))
        body = stack.body()
        return _delivered(sender.send_async(codec.encode_message(body)), consumer, body)

    return run


def _recv(address: str) -> Callable[[Stack, str, str, ExitStack], Seen]:
    def run(stack: Stack, space: str, identity: str, cleanup: ExitStack) -> Seen:
        client = _login(stack, cleanup, space=space, identity=identity)
        receiver = _attach(client, lambda: client.receiver(address))
        body = stack.body()
        producer = _login(stack, cleanup, space=space, identity="ops").sender(address)
        return _delivered(producer.send_async(codec.encode_message(body)), receiver, body)

    return run


def _relay(address: str) -> Callable[[Stack, str, str, ExitStack], Seen]:
    def run(stack: Stack, space: str, identity: str, cleanup: ExitStack) -> Seen:
        client = _login(stack, cleanup, space=space, identity=identity)
        consumer = _login(stack, cleanup, space=space, identity="ops").receiver(address)
        relay = _attach(client, lambda: client.sender(None))
        body = stack.body()
        sent = relay.send_async(codec.encode_message(body, to=address))
        # Either the router settles it at once (rejected), or it reaches the consumer, whose
        # accept is what settles it (anycast): watch both.
        deadline = time.monotonic() + WAIT
        while not sent.done() and time.monotonic() < deadline:
            try:
                delivery = consumer.receive(0.05)
            except TimeoutError:
                continue
            consumer.accept(delivery)
            if codec.read_body(delivery.payload) == body:
                return _delivered_and_accepted(sent)
        if not sent.done():
            return Seen("neither delivered nor settled")
        settled = sent.result()
        if settled.outcome is Outcome.REJECTED:
            link = relay.link
            stays = link is not None and client.call(lambda: link.is_open)
            return _seen(REJECTED + ("" if stays else ", link closed"), settled.error)
        return _delivered(sent, consumer, body)

    return run


def _dynamic_reply(stack: Stack, space: str, identity: str, cleanup: ExitStack) -> Seen:
    client = _login(stack, cleanup, space=space, identity=identity)
    replies = _attach(client, lambda: client.receiver(None, source=Terminus(dynamic=True)))
    reply_to = replies.address
    responder = _login(stack, cleanup, space=space, identity="ops")
    requests = responder.receiver("pq")
    asking = _attach(client, lambda: client.sender("pq"))
    asking.send_async(codec.encode_message("a request", reply_to=reply_to))
    request = _arrives(requests, "a request")
    if request is None:
        return Seen("no request arrived")
    body = stack.body()
    answer = responder.sender(request.reply_to).send_async(codec.encode_message(body))
    return _delivered(answer, replies, body)


def _anothers_reply(stack: Stack, space: str, identity: str, cleanup: ExitStack) -> Seen:
    client = _login(stack, cleanup, space=space, identity=identity)
    owner = _login(stack, cleanup, space=space, identity="ops")
    reply_to = owner.receiver(None, source=Terminus(dynamic=True)).address
    assert reply_to
    try:
        _attach(client, lambda: client.receiver(reply_to))
    except Observed as observed:
        seen = observed.seen
        return replace(seen, description=seen.description.replace(reply_to, "{reply}"))
    return Seen("attached to another connection's reply address")


RUNS: dict[str, Callable[[Stack, str, str, ExitStack], Seen]] = {
    "send pq": _send("pq"),
    "send pq2": _send("pq2"),
    "recv pq": _recv("pq"),
    "recv orders/eu": _recv("orders/eu"),
    "recv sensors.temp": _recv("sensors.temp"),
    "recv sensors.temp.max": _recv("sensors.temp.max"),
    "relay to pq": _relay("pq"),
    "relay to pq2": _relay("pq2"),
    "dynamic reply": _dynamic_reply,
    "recv another's reply": _anothers_reply,
}


def _slug(*parts: str) -> str:
    return ":".join(p.replace(" ", "-").replace("'", "") for p in parts)


def _message_plane_cells() -> list[pytest.ParameterSet]:
    cells = []
    for space, table in ((ACME, MESSAGE_PLANE), (ACME_JMS, BROKERED)):
        for identity, row in table.items():
            for operation, expected in row.items():
                cells.append(
                    pytest.param(
                        space,
                        identity,
                        operation,
                        expected,
                        id=_slug(space, identity, operation),
                    )
                )
    return cells


@pytest.mark.parametrize(("space", "identity", "operation", "expected"), _message_plane_cells())
def test_message_plane(
    stack: Stack, space: str, identity: str, operation: str, expected: Seen
) -> None:
    with ExitStack() as cleanup:
        try:
            seen = RUNS[operation](stack, space, identity, cleanup)
        except Observed as observed:
            seen = observed.seen
    assert seen == expected


def test_the_other_spaces_user_is_a_user_of_its_own_space(stack: Stack) -> None:
    """The 'user of another space' row is refused as a stranger, not for a typo: in globex,
    with the same password, it sends and receives."""
    with ExitStack() as cleanup:
        outsider = _login(stack, cleanup, space=GLOBEX, identity="outsider")
        receiver = outsider.receiver("pq")
        body = stack.body()
        sent = outsider.sender("pq").send_async(codec.encode_message(body))
        assert _delivered(sent, receiver, body) == Seen(RECEIVED)


# ================================================================ the admin API's cells


def _grpc_outcome(call: Callable[[], object]) -> tuple[str, str]:
    try:
        call()
    except grpc.RpcError as error:
        return error.code().name, error.details() or ""
    return OK


def _an_address(name: str, space: str) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata=resources_pb2.Metadata(name=name, space=space),
        spec={"address": name, "type": "anycast", "plan": "standard-anycast"},
    )


class Caller:
    """ConfigService calls as one identity, on the module's one channel (TLS verified against
    var/tls/ca.crt, no client certificate: how a tenant connects, and the admin too; the token
    is what differs)."""

    def __init__(self, stub: config_pb2_grpc.ConfigServiceStub, token: str) -> None:
        self.stub = stub
        self.metadata = bearer_metadata(token)

    def call(self, rpc: str, request: object) -> tuple[str, str]:
        return _grpc_outcome(
            lambda: getattr(self.stub, rpc)(
                request, metadata=self.metadata, timeout=WAIT, wait_for_ready=True
            )
        )

    def watch(self, space: str) -> tuple[str, str]:
        """The list phase of a watch of addresses (up to SYNCED): every one of `space`."""
        request = config_pb2.WatchRequest(kinds=["Address"], space=space)
        call = self.stub.Watch(request, metadata=self.metadata, timeout=WAIT, wait_for_ready=True)

        def listed() -> None:
            for event in call:
                if event.type == config_pb2.WatchEvent.SYNCED:
                    return
                assert event.object.address.metadata.space == space

        try:
            return _grpc_outcome(listed)
        finally:
            call.cancel()


@pytest.mark.parametrize(
    ("identity", "operation", "space", "expected"),
    [pytest.param(*key, expected, id=_slug(*key)) for key, expected in ADMIN_API.items()],
)
def test_admin_api(
    stack: Stack, identity: str, operation: str, space: str, expected: tuple[str, str]
) -> None:
    admin, caller = (
        Caller(stack.config, stack.secrets["admin"]),
        Caller(stack.config, stack.secrets[identity]),
    )
    name = _slug(operation, identity).replace(":", "-")  # the address a write makes or deletes
    made = config_pb2.ObjectRef(space=space, name=name)
    if operation == "delete":  # something to delete, made by the admin
        assert admin.call("CreateAddress", _an_address(name, space)) == OK
    requests = {
        "list": config_pb2.ListRequest(space=space),
        "get": config_pb2.ObjectRef(space=space, name="pq"),
        "create": _an_address(name, space),
        "delete": config_pb2.DeleteRequest(ref=made),
    }
    if operation == "watch":
        seen = caller.watch(space)
    else:
        seen = caller.call(RPCS[operation], requests[operation])
    exists = admin.call("GetAddress", made)
    if exists == OK:  # what the cell made (or failed to delete) goes
        assert admin.call("DeleteAddress", config_pb2.DeleteRequest(ref=made)) == OK
    code, message = expected
    assert seen == (code, message.format(expired_at=stack.expired_at))
    if operation in ("create", "delete"):  # a refused write wrote nothing
        assert (exists == OK) == ((operation == "delete") != (seen == OK))


# ================================================================ the transport's cells


def _files_of(directory: Path, *, cert_of: TlsFiles, trusting: Path) -> TlsFiles:
    """`cert_of`'s certificate and key, trusting the CA file `trusting`."""
    files = TlsFiles(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files.cert.write_bytes(cert_of.cert.read_bytes())
    files.key.write_bytes(cert_of.key.read_bytes())
    files.ca.write_bytes(trusting.read_bytes())
    return files


def _another_ca(tmp: Path) -> TlsFiles:
    """A stranger's CA and a control-plane certificate it signed."""
    authority = ensure_authority(tmp / "other-ca", name="someone-else")
    holder = Holder(name="router-9", role=CONTROL_PLANE)
    return ensure_certificate(tmp / "other-ca" / "holder", holder, authority=authority)


def _client_files(client: str, *, var: Path, tmp: Path, server_ca: Path) -> TlsFiles | None:
    """The certificate a TRANSPORT client presents (None: none); each trusts the server, so
    that only its own certificate can be what is wrong."""
    tls = var / "tls"
    if client.startswith(("plaintext", "a tenant's channel")):
        return None
    if client.startswith("the operator's certificate (not of etcd's CA)"):
        return _files_of(tmp / "operator", cert_of=TlsFiles(tls / "operator"), trusting=server_ca)
    if client.startswith("a certificate of another CA"):
        return _files_of(tmp / "theirs", cert_of=_another_ca(tmp), trusting=server_ca)
    holders = {
        "the operator's certificate": "operator",
        "config's etcd certificate": "config-etcd",
        "a router's certificate": "router",
    }
    return next(TlsFiles(tls / d) for prefix, d in holders.items() if client.startswith(prefix))


def _credentials(
    client: str, *, var: Path, tmp: Path, server_ca: Path
) -> grpc.ChannelCredentials | None:
    """How a TRANSPORT client opens its gRPC channel (None: plaintext): a tenant's channel
    verifies the server and presents nothing, the others present `_client_files`."""
    if client.startswith("plaintext"):
        return None
    if client.startswith("a tenant's channel trusting another CA"):
        return verifying_credentials(_another_ca(tmp).ca)
    if client.startswith("a tenant's channel"):
        return verifying_credentials(var / "tls" / "ca.crt")  # what `enmasse up` publishes
    files = _client_files(client, var=var, tmp=tmp, server_ca=server_ca)
    assert files is not None
    return channel_credentials(files)


Metadata = tuple[tuple[str, str], ...]


def _grpc_reaches(
    target: str,
    credentials: grpc.ChannelCredentials | None,
    call: Callable[[grpc.Channel, Metadata], object],
    *,
    metadata: Metadata,
) -> tuple[str, str | None]:
    channel = (
        grpc.secure_channel(target, credentials)
        if credentials is not None
        else grpc.insecure_channel(target)
    )
    with channel:
        code, message = _grpc_outcome(lambda: call(channel, metadata))
    if code == "UNAVAILABLE":
        return UNAVAILABLE
    return ANSWERED if (code, message) == OK else (code, message)


def _etcd_status(channel: grpc.Channel, _metadata: Metadata) -> object:
    """etcd's Maintenance/Status with an empty request, as raw bytes: no etcd stubs needed."""
    status = channel.unary_unary(
        "/etcdserverpb.Maintenance/Status",
        request_serializer=lambda request: request,
        response_deserializer=lambda response: response,
    )
    return status(b"", timeout=5)


def _amqp_refusal(port: int, **login: object) -> tuple[str, str | None]:
    try:
        client = Client("127.0.0.1", port, timeout=5, **login)  # type: ignore[arg-type]
    except AmqpError as error:
        condition = error.condition or Condition("(closed without a condition)")
        if condition.name == UNAUTHORIZED:
            return LOGIN_REFUSED, condition.description
        return condition.name, condition.description
    client.close()
    return ("connected", None)


def _grpc_targets(
    stack: Stack, found: LocalDirectory
) -> dict[str, tuple[str, Callable[[grpc.Channel, Metadata], object], Path]]:
    """Target -> (address, a call it answers, the CA file of its server certificate)."""
    var = stack.var
    grpc_ca, etcd_ca = var / "tls" / "ca.crt", var / "tls" / "config-etcd" / "ca.crt"
    etcd = f"127.0.0.1:{json.loads((var / 'ports.json').read_text())['etcd_client']}"
    broker = next(iter(found.brokers(ACME_JMS).values()))
    return {
        "config": (
            stack.runtime.config,
            lambda channel, metadata: config_pb2_grpc.ConfigServiceStub(channel).ListAddressSpaces(
                config_pb2.ListRequest(), metadata=metadata, timeout=5
            ),
            grpc_ca,
        ),
        "acme's RouterAdmin": (
            found.routers(ACME)[0].admin,
            lambda channel, _: router_pb2_grpc.RouterAdminStub(channel).GetStats(
                router_pb2.StatsRequest(), timeout=5
            ),
            grpc_ca,
        ),
        "acme-jms's BrokerAdmin": (
            broker.admin,
            lambda channel, _: broker_pb2_grpc.BrokerAdminStub(channel).ListAddresses(
                broker_pb2.ListAddressesRequest(), timeout=5
            ),
            grpc_ca,
        ),
        "etcd": (etcd, _etcd_status, etcd_ca),
    }


def _amqp_targets(stack: Stack, found: LocalDirectory) -> dict[str, tuple[int | None, Path]]:
    """Target -> (its AMQP port, None when it has none; the CA file of its certificate)."""
    internal, published = stack.var / "tls" / "ca" / "ca.crt", stack.var / "tls" / "ca.crt"
    broker = next(iter(found.brokers(ACME).values()))
    return {
        "acme's inter-router port": (found.routers(ACME)[0].inter_router_port, internal),
        "acme's broker (behind the router)": (broker.amqp_port, internal),
        "acme's amqps endpoint": (stack.amqps(ACME), published),
        "acme-jms's amqps endpoint": (stack.amqps(ACME_JMS), published),
    }


def _transport(stack: Stack, target: str, client: str, tmp: Path) -> tuple[str, str | None]:
    found = LocalDirectory(stack.var)
    found.refresh()
    grpc_targets = _grpc_targets(stack, found)
    if target in grpc_targets:
        address, call, server_ca = grpc_targets[target]
        credentials = _credentials(client, var=stack.var, tmp=tmp, server_ca=server_ca)
        token = stack.secrets["admin"] if "with the admin token" in client else ""
        return _grpc_reaches(address, credentials, call, metadata=bearer_metadata(token))
    port, server_ca = _amqp_targets(stack, found)[target]
    if port is None:
        return ("no such listener", None)
    for mechanism in ("SCRAM", "PLAIN"):
        if client.startswith(f"sender, {mechanism} over TLS"):  # as a tenant's client logs in
            tls = Tls(ca_file=str(server_ca), verify_hostname=True)
            mechanisms = sasl.CLIENT_MECHANISMS if mechanism == "SCRAM" else (sasl.PLAIN,)
            user = {"user": "sender", "password": PASSWORDS["sender"], "hostname": "localhost"}
            return _amqp_refusal(port, tls=tls, mechanisms=mechanisms, **user)
    files = _client_files(client, var=stack.var, tmp=tmp, server_ca=server_ca)
    login: dict[str, object] = {"tls": mutual_tls(files)} if files is not None else {}
    for space in (ACME, GLOBEX):
        if client.endswith(f"{space}'s mesh secret"):
            secret = (stack.var / "routers" / space / "mesh-secret").read_text().strip()
            login.update(container_id="router-9", user="router-9", password=secret)
    return _amqp_refusal(port, **login)


def _not_yet(target: str, client: str) -> list[pytest.MarkDecorator]:
    reason = NOT_YET.get((target, client))
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


@pytest.mark.parametrize(
    ("target", "client", "expected"),
    [
        pytest.param(*key, expected, id=_slug(*key), marks=_not_yet(*key))
        for key, expected in TRANSPORT.items()
    ],
)
def test_transport(
    stack: Stack, tmp_path: Path, target: str, client: str, expected: tuple[str, str | None]
) -> None:
    seen = _transport(stack, target, client, tmp_path)
    if expected[1] is None:  # the TLS library's words: not compared
        seen = (seen[0], None)
    assert seen == expected
