"""Who may do what (`enmasse.config.access.authorize`) and who a token is
(`enmasse.config.tokens`), pure: no network, no store."""

from __future__ import annotations

import grpc
import pytest
from enmasse.config.access import (
    ADMIN,
    CONTROLLER,
    GITOPS,
    OPEN,
    OPERATIONS,
    ROLES,
    SUBSCRIPTION,
    TENANT_ADMIN,
    TOKEN_ROLES,
    VIEWER,
    WATCH_WITH_SECRETS,
    Identity,
    authorize,
    authorize_applied,
    sees,
    space_of,
    visible_spaces,
)
from enmasse.config.tokens import bearer_of, check_request, digest_of, identity_of, new_secret
from enmasse.config.writes import Refused
from enmasse.resources.kinds import KINDS
from enmasse.v1 import config_pb2

TENANT = Identity("tenant-a", TENANT_ADMIN, frozenset({"a"}))
VIEWING = Identity("viewer-a", VIEWER, frozenset({"a"}))
ADMINISTRATOR = Identity("root", ADMIN)
AGENT = Identity("router-agent", CONTROLLER)
SUBSCRIBER = Identity("subscription", SUBSCRIPTION)
SYNC = Identity("gitops", GITOPS)


def allowed(identity: Identity, rpc: str, space: str = "") -> bool:
    return authorize(identity, rpc, space).allowed


def test_every_rpc_of_the_service_is_an_operation() -> None:
    service = config_pb2.DESCRIPTOR.services_by_name["ConfigService"]
    for method in service.methods:
        operation = OPERATIONS[method.name]
        assert operation.kind in ("", *KINDS), method.name
    assert OPERATIONS["ListAddresses"].kind == "Address"
    assert OPERATIONS["UpdateAddressSpaceStatus"].verb == "status"
    assert OPERATIONS["DeleteMessagingUser"].verb == "write"


def test_an_unknown_rpc_or_role_is_refused() -> None:
    assert not allowed(ADMINISTRATOR, "DropEverything")
    assert not allowed(Identity("x", "root"), "ListAddresses", "a")


def test_the_admin_does_everything_but_read_secrets() -> None:
    for rpc in OPERATIONS:
        if rpc != WATCH_WITH_SECRETS:
            assert allowed(ADMINISTRATOR, rpc, "any"), rpc
    assert not allowed(ADMINISTRATOR, WATCH_WITH_SECRETS)


def test_a_tenant_admin_writes_addresses_and_users_of_its_spaces_only() -> None:
    for rpc in ("CreateAddress", "UpdateAddress", "DeleteAddress", "CreateMessagingUser"):
        assert allowed(TENANT, rpc, "a"), rpc
        assert not allowed(TENANT, rpc, "b"), rpc
    for rpc in ("GetAddressSpace", "ListAddresses", "Watch", "GetMessagingUser"):
        assert allowed(TENANT, rpc, "a"), rpc
        assert not allowed(TENANT, rpc, "b"), rpc
    for rpc in ("UpdateAddressSpace", "DeleteAddressSpace", "UpdateAddressStatus"):
        assert not allowed(TENANT, rpc, "a"), rpc
    assert not allowed(TENANT, "CreateAddressPlan")
    assert allowed(TENANT, "ListAddressPlans")
    assert allowed(TENANT, "Apply", "a")
    assert not allowed(TENANT, "Apply", "b")
    assert not allowed(TENANT, "Apply", "")  # the plans' scope
    assert not allowed(TENANT, "CreateToken")


def test_a_viewer_reads_its_spaces() -> None:
    assert allowed(VIEWING, "ListAddresses", "a")
    assert allowed(VIEWING, "ListAddresses", "")  # every space: narrowed to its own
    assert not allowed(VIEWING, "ListAddresses", "b")
    assert not allowed(VIEWING, "CreateAddress", "a")
    assert not allowed(VIEWING, "Apply", "a")


def test_the_control_plane_roles() -> None:
    assert allowed(AGENT, "UpdateAddressStatus", "b")
    assert allowed(AGENT, "UpdateAddressSpaceStatus", "b")
    assert allowed(AGENT, WATCH_WITH_SECRETS)
    assert not allowed(AGENT, "UpdateAddress", "b")
    assert not allowed(AGENT, "Apply", "b")
    assert allowed(SUBSCRIBER, "UpdateAddress", "b")
    assert not allowed(SUBSCRIBER, "DeleteAddressSpace", "b")
    assert not allowed(SUBSCRIBER, "UpdateAddressStatus", "b")
    assert allowed(SYNC, "Apply", "b")
    assert not allowed(SYNC, "CreateAddress", "b")  # writes through Apply only
    for identity in (AGENT, SUBSCRIBER, SYNC):
        assert allowed(identity, "ListAddresses", "")
        assert not allowed(identity, "ListTokens")


def test_what_an_apply_may_write() -> None:
    assert authorize_applied(SYNC, "CreateAddressSpace", "b").allowed
    assert authorize_applied(SYNC, "DeleteAddress", "b").allowed
    assert not authorize_applied(SYNC, "CreateAddressPlan", "").allowed
    assert authorize_applied(TENANT, "CreateAddress", "a").allowed
    refused = authorize_applied(TENANT, "UpdateAddressSpace", "a")
    assert refused.reason == (
        "token 'tenant-a' (tenant-admin of a) may not UpdateAddressSpace (by Apply) "
        "in address space 'a'"
    )
    assert not authorize_applied(TENANT, "CreateAddress", "b").allowed
    assert not authorize_applied(VIEWING, "CreateAddress", "a").allowed


def test_a_refusal_names_the_caller_and_the_space() -> None:
    assert authorize(TENANT, "DeleteAddressSpace", "b").reason == (
        "token 'tenant-a' (tenant-admin of a) may not DeleteAddressSpace in address space 'b'"
    )
    assert authorize(AGENT, "CreateToken", "").reason == (
        "token 'router-agent' (controller) may not CreateToken"
    )


def test_open_is_everything_and_no_token_role() -> None:
    for rpc in OPERATIONS:
        assert allowed(OPEN, rpc, "a"), rpc
    assert visible_spaces(OPEN) is None
    assert "open" not in TOKEN_ROLES
    assert set(TOKEN_ROLES) | {"open"} == set(ROLES)


def test_what_a_list_of_every_space_shows() -> None:
    assert visible_spaces(TENANT) == {"a"}
    assert visible_spaces(ADMINISTRATOR) is None
    assert space_of(("AddressSpace", "", "a")) == "a"
    assert space_of(("Address", "a", "q")) == "a"
    assert space_of(("AddressPlan", "", "small")) == ""
    assert sees(frozenset({"a"}), ("Address", "a", "q"))
    assert not sees(frozenset({"a"}), ("Address", "b", "q"))
    assert not sees(frozenset({"a"}), ("AddressSpace", "", "b"))
    assert sees(frozenset({"a"}), ("AddressPlan", "", "small"))
    assert sees(None, ("Address", "b", "q"))


# ---------------------------------------------------------------- tokens


def _unauthenticated(call: object) -> str:
    with pytest.raises(Refused) as refused:
        call()  # type: ignore[operator]
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    return refused.value.message


def test_the_bearer_metadata() -> None:
    assert bearer_of([("authorization", "Bearer abc")]) == "abc"
    assert bearer_of([("x", "y"), ("Authorization", "bearer  abc ")]) == "abc"
    assert _unauthenticated(lambda: bearer_of([])) == (
        "no credentials: call with the metadata 'authorization: Bearer <token>'"
    )
    assert _unauthenticated(lambda: bearer_of([("authorization", "Basic xyz")])) == (
        "the authorization metadata must be 'Bearer <token>'"
    )


def test_who_a_stored_token_is() -> None:
    token = config_pb2.Token(name="t", role=TENANT_ADMIN, spaces=["a", "b"])
    assert identity_of(token, now=100.0) == Identity("t", TENANT_ADMIN, frozenset({"a", "b"}))
    assert _unauthenticated(lambda: identity_of(None, now=100.0)) == "unknown token"
    token.expires_at.FromSeconds(100)
    assert _unauthenticated(lambda: identity_of(token, now=100.0)) == (
        "token 't' expired at 1970-01-01T00:01:40Z"
    )
    assert identity_of(token, now=99.9).name == "t"
    token.revoked = True
    assert _unauthenticated(lambda: identity_of(token, now=0.0)) == "token 't' has been revoked"


def test_secrets_are_random_and_stored_as_their_hash() -> None:
    one, two = new_secret(), new_secret()
    assert one != two
    assert len(one) >= 43
    assert digest_of(one) != digest_of(two)
    assert len(digest_of(one)) == 64
    assert one not in digest_of(one)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (config_pb2.CreateTokenRequest(name="ok", role="viewer", spaces=["a"]), None),
        (config_pb2.CreateTokenRequest(name="ok", role="controller"), None),
        (config_pb2.CreateTokenRequest(name="-x", role="admin"), "name: '-x' must be"),
        (config_pb2.CreateTokenRequest(name="x", role="open"), "role: 'open' is not a role"),
        (config_pb2.CreateTokenRequest(name="x", role="tenant-admin"), "spaces: a tenant-admin"),
        (config_pb2.CreateTokenRequest(name="x", role="gitops", spaces=["a"]), "spaces: a gitops"),
        (
            config_pb2.CreateTokenRequest(name="x", role="admin", expires_in_seconds=-1),
            "expires_in_seconds must not be negative",
        ),
    ],
)
def test_what_a_token_request_must_say(
    request_: config_pb2.CreateTokenRequest, message: str | None
) -> None:
    if message is None:
        check_request(request_)
        return
    with pytest.raises(Refused) as refused:
        check_request(request_)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.message.startswith(message)
