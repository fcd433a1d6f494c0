"""Admin API authentication and authorization (issue #15, item 4), on real processes.

One real etcd and one real `enmasse-config --bootstrap-token-file FILE` process. The matrix: for
no token, a bad token, an expired token, a revoked token, the admin token, a tenant-admin of
space A and a viewer of space A, each of list / get / create / delete / watch of addresses, in
space A and in space B, with the exact gRPC code and message each gets. Then what else the edge
promises: a tenant's List and Watch of every space show its own only, no call returns a password
hash (the control plane's Watch with_secrets excepted), the token RPCs are the admin's, an Apply
is refused as a whole when it would write what the caller may not, and a config started without
--auth stays open.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from enmasse.common.credentials import bearer_metadata
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.config_service import SPACE_QUEUES, ConfigProcess
from tests.fixtures.etcd import EtcdProcess

Ref = config_pb2.ObjectRef
A, B = "a", "b"
NO_CREDENTIALS = "no credentials: call with the metadata 'authorization: Bearer <token>'"
OK = ("OK", "")


def space(name: str) -> resources_pb2.AddressSpace:
    return resources_pb2.AddressSpace(
        metadata=resources_pb2.Metadata(name=name),
        spec={"type": "standard", "plan": "standard-small"},
    )


def address(name: str, *, in_space: str) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata=resources_pb2.Metadata(name=name, space=in_space),
        spec={"address": name, "type": "queue", "plan": "standard-small-queue"},
    )


def user(name: str, *, in_space: str) -> resources_pb2.MessagingUser:
    return resources_pb2.MessagingUser(
        metadata=resources_pb2.Metadata(name=name, space=in_space),
        spec={"username": name, "password": "s3cret"},
    )


class Caller:
    """A ConfigService stub whose calls carry one token ("" for none)."""

    def __init__(self, stub: config_pb2_grpc.ConfigServiceStub, token: str) -> None:
        self.stub = stub
        self.metadata = bearer_metadata(token)

    async def outcome(self, rpc: str, request: object) -> tuple[str, str]:
        try:
            await getattr(self.stub, rpc)(request, metadata=self.metadata, timeout=10)
        except grpc.aio.AioRpcError as error:
            return error.code().name, error.details() or ""
        return OK

    async def watch_outcome(self, request: config_pb2.WatchRequest) -> tuple[str, str]:
        call = self.stub.Watch(request, metadata=self.metadata, timeout=10)
        try:
            await call.read()
        except grpc.aio.AioRpcError as error:
            return error.code().name, error.details() or ""
        finally:
            call.cancel()
        return OK

    async def watched(self, request: config_pb2.WatchRequest) -> list[config_pb2.WatchEvent]:
        """The events of the list phase (up to SYNCED)."""
        events = []
        call = self.stub.Watch(request, metadata=self.metadata, timeout=10)
        try:
            async for event in call:
                if event.type == config_pb2.WatchEvent.SYNCED:
                    break
                events.append(event)
        finally:
            call.cancel()
        return events


@pytest.fixture
async def secured(
    etcd: EtcdProcess,
    etcd_prefix: str,
    config_process_factory: Callable[..., ConfigProcess],
    tmp_path: Path,
) -> AsyncIterator[tuple[config_pb2_grpc.ConfigServiceStub, str]]:
    """A config process with auth on; (a stub without credentials, the admin token)."""
    admin = "the-bootstrap-admin-token-of-this-test-0123456789"
    bootstrap = tmp_path / "admin-token"
    bootstrap.write_text(admin + "\n")
    config = config_process_factory(
        etcd_endpoint=etcd.endpoint,
        prefix=etcd_prefix,
        extra_args=[f"--bootstrap-token-file={bootstrap}"],
    )
    async with grpc.aio.insecure_channel(config.target) as channel:
        yield config_pb2_grpc.ConfigServiceStub(channel), admin


async def _token(admin: Caller, name: str, role: str, *spaces: str, expires: int = 0) -> str:
    request = config_pb2.CreateTokenRequest(
        name=name, role=role, spaces=list(spaces), expires_in_seconds=expires
    )
    reply = await admin.stub.CreateToken(request, metadata=admin.metadata, timeout=10)
    return str(reply.secret)


async def _identities(
    stub: config_pb2_grpc.ConfigServiceStub, admin_token: str
) -> tuple[dict[str, Caller], str]:
    """Every caller of the matrix, and the message the expired one gets."""
    admin = Caller(stub, admin_token)
    revoked = await _token(admin, "revoked", "viewer", A)
    await stub.RevokeToken(
        config_pb2.RevokeTokenRequest(name="revoked"), metadata=admin.metadata, timeout=10
    )
    expired = await _token(admin, "expired", "tenant-admin", A, expires=1)
    callers = {
        "no token": Caller(stub, ""),
        "bad token": Caller(stub, "not-a-token-anybody-made"),
        "expired": Caller(stub, expired),
        "revoked": Caller(stub, revoked),
        "admin": admin,
        "tenant-admin of a": Caller(stub, await _token(admin, "tenant-a", "tenant-admin", A)),
        "viewer of a": Caller(stub, await _token(admin, "viewer-a", "viewer", A)),
    }
    listed = await stub.ListTokens(config_pb2.ListTokensRequest(), metadata=admin.metadata)
    record = next(t for t in listed.items if t.name == "expired")
    when = record.expires_at.ToDatetime().isoformat(timespec="seconds")
    await asyncio.sleep(max(0.0, record.expires_at.ToNanoseconds() / 1e9 - time.time()) + 0.2)
    return callers, f"token 'expired' expired at {when}Z"


async def _matrix(callers: dict[str, Caller]) -> dict[tuple[str, str, str], tuple[str, str]]:
    found: dict[tuple[str, str, str], tuple[str, str]] = {}
    for who, caller in callers.items():
        slug = who.replace(" ", "-")
        for where in (A, B):
            found[(who, "list", where)] = await caller.outcome(
                "ListAddresses", config_pb2.ListRequest(space=where)
            )
            found[(who, "get", where)] = await caller.outcome(
                "GetAddress", Ref(space=where, name="q")
            )
            found[(who, "create", where)] = await caller.outcome(
                "CreateAddress", address(f"{slug}-q", in_space=where)
            )
            found[(who, "delete", where)] = await caller.outcome(
                "DeleteAddress", config_pb2.DeleteRequest(ref=Ref(space=where, name=f"{slug}-q"))
            )
            found[(who, "watch", where)] = await caller.watch_outcome(
                config_pb2.WatchRequest(kinds=["Address"], space=where)
            )
    return found


def _expected(expired_message: str) -> dict[tuple[str, str, str], tuple[str, str]]:
    verbs = {
        "list": "ListAddresses",
        "get": "GetAddress",
        "create": "CreateAddress",
        "delete": "DeleteAddress",
        "watch": "Watch",
    }
    refusals = {
        "no token": ("UNAUTHENTICATED", NO_CREDENTIALS),
        "bad token": ("UNAUTHENTICATED", "unknown token"),
        "expired": ("UNAUTHENTICATED", expired_message),
        "revoked": ("UNAUTHENTICATED", "token 'revoked' has been revoked"),
    }
    expected: dict[tuple[str, str, str], tuple[str, str]] = {}
    for verb, rpc in verbs.items():
        for where in (A, B):
            for who, refusal in refusals.items():
                expected[(who, verb, where)] = refusal
            expected[("admin", verb, where)] = OK

            def denied(token: str, role: str, *, rpc: str = rpc, where: str = where) -> tuple:
                return (
                    "PERMISSION_DENIED",
                    f"token '{token}' ({role} of a) may not {rpc} in address space '{where}'",
                )

            tenant = OK if where == A else denied("tenant-a", "tenant-admin")
            expected[("tenant-admin of a", verb, where)] = tenant
            reads = verb in ("list", "get", "watch")
            viewer = OK if where == A and reads else denied("viewer-a", "viewer")
            expected[("viewer of a", verb, where)] = viewer
    return expected


def _table(found: dict[tuple[str, str, str], tuple[str, str]]) -> str:
    lines = []
    for (who, verb, where), (code, message) in found.items():
        lines.append(f"{who:<18} {verb:<7} {where}  {code:<18} {message}")
    return "\n".join(lines)


async def test_the_matrix_every_caller_every_verb_own_space_and_another(secured) -> None:
    stub, admin_token = secured
    admin = Caller(stub, admin_token)
    for name in (A, B):
        assert await admin.outcome("CreateAddressSpace", space(name)) == OK
        assert await admin.outcome("CreateAddress", address("q", in_space=name)) == OK
    callers, expired_message = await _identities(stub, admin_token)

    found = await _matrix(callers)
    print("\n" + _table(found))  # the report's table: pytest -s
    expected = _expected(expired_message)
    assert found == expected, "\n" + _table(
        {k: v for k, v in found.items() if expected.get(k) != v}
    )
    # Nothing a refused caller tried was done: B has only its own address (and the space's
    # queues: the DLQ and the MQTT stores) left.
    left = await stub.ListAddresses(config_pb2.ListRequest(space=B), metadata=admin.metadata)
    assert [a.metadata.name for a in left.items] == sorted(["q", *SPACE_QUEUES])


async def test_a_tenant_sees_only_its_spaces_and_no_secrets(secured) -> None:
    stub, admin_token = secured
    admin = Caller(stub, admin_token)
    for name in (A, B):
        assert await admin.outcome("CreateAddressSpace", space(name)) == OK
        assert await admin.outcome("CreateAddress", address("q", in_space=name)) == OK
        assert await admin.outcome("CreateMessagingUser", user("app", in_space=name)) == OK
    tenant = Caller(stub, await _token(admin, "tenant-a", "tenant-admin", A))

    spaces = await stub.ListAddressSpaces(config_pb2.ListRequest(), metadata=tenant.metadata)
    assert [s.metadata.name for s in spaces.items] == [A]
    addresses = await stub.ListAddresses(config_pb2.ListRequest(), metadata=tenant.metadata)
    assert [(a.metadata.space, a.metadata.name) for a in addresses.items] == [
        (A, name) for name in sorted(["q", *SPACE_QUEUES])
    ]
    plans = await stub.ListAddressPlans(config_pb2.ListRequest(), metadata=tenant.metadata)
    assert plans.items, "every space uses the plans: a tenant reads them"
    events = await tenant.watched(config_pb2.WatchRequest())
    seen = {(e.object.WhichOneof("kind"), _where(e.object)) for e in events}
    assert {where for _, where in seen} <= {A, ""}
    assert ("address", A) in seen
    assert ("messaging_user", A) in seen

    # No call returns a password hash: not List, Get, Watch, nor a write's answer.
    for caller in (admin, tenant):
        users = await stub.ListMessagingUsers(
            config_pb2.ListRequest(space=A), metadata=caller.metadata
        )
        assert [u.spec.password_hash for u in users.items] == [""]
        got = await stub.GetMessagingUser(Ref(space=A, name="app"), metadata=caller.metadata)
        assert (got.spec.password, got.spec.password_hash) == ("", "")
        watched = await caller.watched(config_pb2.WatchRequest(kinds=["MessagingUser"]))
        assert watched
        assert all(not e.object.messaging_user.spec.password_hash for e in watched)
    made = await stub.CreateMessagingUser(user("other", in_space=A), metadata=tenant.metadata)
    assert made.spec.password_hash == ""

    # The hashes go to the control plane only, on its Watch with_secrets.
    secrets_request = config_pb2.WatchRequest(kinds=["MessagingUser"], with_secrets=True)
    for caller, who in (
        (admin, "token 'admin' (admin)"),
        (tenant, "token 'tenant-a' (tenant-admin of a)"),
    ):
        assert await caller.watch_outcome(secrets_request) == (
            "PERMISSION_DENIED",
            f"{who} may not WatchWithSecrets",
        )
    controller = Caller(stub, await _token(admin, "router-agent", "controller"))
    hashes = [
        e.object.messaging_user.spec.password_hash
        for e in await controller.watched(secrets_request)
    ]
    assert len(hashes) == 3
    assert all(h.startswith("scrypt$") for h in hashes)
    plain = await controller.watched(config_pb2.WatchRequest(kinds=["MessagingUser"]))
    assert all(not e.object.messaging_user.spec.password_hash for e in plain)


def _where(resource: resources_pb2.Resource) -> str:
    kind = resource.WhichOneof("kind")
    obj = getattr(resource, kind)
    if kind == "address_space":
        return str(obj.metadata.name)
    return str(obj.metadata.space)


async def test_what_each_role_may_write(secured) -> None:
    stub, admin_token = secured
    admin = Caller(stub, admin_token)
    for name in (A, B):
        assert await admin.outcome("CreateAddressSpace", space(name)) == OK
        assert await admin.outcome("CreateAddress", address("q", in_space=name)) == OK
    tenant = Caller(stub, await _token(admin, "tenant-a", "tenant-admin", A))
    controller = Caller(stub, await _token(admin, "storage-controller", "controller"))
    gitops = Caller(stub, await _token(admin, "gitops", "gitops"))

    # Another tenant's space cannot be deleted (the "today"), nor its own.
    delete_b = config_pb2.DeleteRequest(ref=Ref(name=B))
    assert await tenant.outcome("DeleteAddressSpace", delete_b) == (
        "PERMISSION_DENIED",
        "token 'tenant-a' (tenant-admin of a) may not DeleteAddressSpace in address space 'b'",
    )
    delete_a = config_pb2.DeleteRequest(ref=Ref(name=A))
    assert (await tenant.outcome("DeleteAddressSpace", delete_a))[0] == "PERMISSION_DENIED"
    assert await tenant.outcome(
        "CreateAddressPlan",
        resources_pb2.AddressPlan(
            metadata=resources_pb2.Metadata(name="mine"), spec={"address_type": "queue"}
        ),
    ) == ("PERMISSION_DENIED", "token 'tenant-a' (tenant-admin of a) may not CreateAddressPlan")

    # Apply: to its own space, of addresses and users; as a whole refused when it would write
    # what the role may not (the space itself), a dry run too.
    batch = [resources_pb2.Resource(address=address("r", in_space=A))]
    apply = config_pb2.ApplyRequest(space=A, manager="tenant", resources=batch)
    assert await tenant.outcome("Apply", apply) == OK
    with_space = config_pb2.ApplyRequest(
        space=A,
        manager="tenant",
        dry_run=True,
        resources=[resources_pb2.Resource(address_space=space(A)), *batch],
    )
    with_space.resources[0].address_space.metadata.labels["owner"] = "tenant"
    assert await tenant.outcome("Apply", with_space) == (
        "PERMISSION_DENIED",
        "token 'tenant-a' (tenant-admin of a) may not UpdateAddressSpace (by Apply) in "
        "address space 'a'",
    )
    assert await tenant.outcome("Apply", config_pb2.ApplyRequest(space=B)) == (
        "PERMISSION_DENIED",
        "token 'tenant-a' (tenant-admin of a) may not Apply in address space 'b'",
    )

    # The controller writes statuses only; gitops writes through Apply only.
    status = config_pb2.UpdateAddressStatusRequest(
        ref=Ref(space=B, name="q"), status=resources_pb2.AddressStatus()
    )
    assert await controller.outcome("UpdateAddressStatus", status) == OK
    assert await tenant.outcome("UpdateAddressStatus", status) == (
        "PERMISSION_DENIED",
        "token 'tenant-a' (tenant-admin of a) may not UpdateAddressStatus in address space 'b'",
    )
    assert await controller.outcome("CreateAddress", address("x", in_space=B)) == (
        "PERMISSION_DENIED",
        "token 'storage-controller' (controller) may not CreateAddress in address space 'b'",
    )
    assert await gitops.outcome("CreateAddress", address("x", in_space=B)) == (
        "PERMISSION_DENIED",
        "token 'gitops' (gitops) may not CreateAddress in address space 'b'",
    )
    synced = config_pb2.ApplyRequest(
        space="c",
        manager="gitops",
        resources=[
            resources_pb2.Resource(address_space=space("c")),
            resources_pb2.Resource(address=address("x", in_space="c")),
        ],
    )
    assert await gitops.outcome("Apply", synced) == OK

    # Tokens are the admin's.
    for caller in (tenant, controller, gitops):
        code, _ = await caller.outcome("ListTokens", config_pb2.ListTokensRequest())
        assert code == "PERMISSION_DENIED"
    create = config_pb2.CreateTokenRequest(name="mine", role="admin")
    assert await tenant.outcome("CreateToken", create) == (
        "PERMISSION_DENIED",
        "token 'tenant-a' (tenant-admin of a) may not CreateToken",
    )


async def test_tokens_are_made_listed_replaced_and_revoked(secured) -> None:
    stub, admin_token = secured
    admin = Caller(stub, admin_token)
    secret = await _token(admin, "viewer-a", "viewer", A)
    assert len(secret) >= 40
    listed = await stub.ListTokens(config_pb2.ListTokensRequest(), metadata=admin.metadata)
    assert [(t.name, t.role, list(t.spaces), t.revoked) for t in listed.items] == [
        ("admin", "admin", [], False),
        ("viewer-a", "viewer", [A], False),
    ]
    assert secret not in str(listed)
    assert await admin.outcome(
        "CreateToken", config_pb2.CreateTokenRequest(name="viewer-a", role="viewer", spaces=[A])
    ) == (
        "ALREADY_EXISTS",
        "token 'viewer-a' already exists (revoke it, or create it with replace)",
    )
    bad = [
        (config_pb2.CreateTokenRequest(name="x", role="root"), "role: 'root' is not a role"),
        (config_pb2.CreateTokenRequest(name="x", role="viewer"), "spaces: a viewer token needs"),
        (
            config_pb2.CreateTokenRequest(name="x", role="admin", spaces=[A]),
            "spaces: a admin token covers every space",
        ),
        (config_pb2.CreateTokenRequest(name="Bad Name", role="admin"), "name: 'Bad Name'"),
    ]
    for request, start in bad:
        code, message = await admin.outcome("CreateToken", request)
        assert (code, message[: len(start)]) == ("INVALID_ARGUMENT", start)

    replaced = await stub.CreateToken(
        config_pb2.CreateTokenRequest(name="viewer-a", role="viewer", spaces=[A], replace=True),
        metadata=admin.metadata,
    )
    list_a = config_pb2.ListRequest(space=A)
    assert await Caller(stub, secret).outcome("ListAddresses", list_a) == (
        "UNAUTHENTICATED",
        "unknown token",
    )
    assert await Caller(stub, replaced.secret).outcome("ListAddresses", list_a) == OK
    assert await admin.outcome("RevokeToken", config_pb2.RevokeTokenRequest(name="nobody")) == (
        "NOT_FOUND",
        "token 'nobody' not found",
    )


async def test_a_config_without_auth_stays_open(
    etcd: EtcdProcess, etcd_prefix: str, config_process_factory: Callable[..., ConfigProcess]
) -> None:
    config = config_process_factory(etcd_endpoint=etcd.endpoint, prefix=etcd_prefix)
    async with grpc.aio.insecure_channel(config.target) as channel:
        anybody = Caller(config_pb2_grpc.ConfigServiceStub(channel), "")
        assert await anybody.outcome("CreateAddressSpace", space(A)) == OK
        assert (
            await anybody.outcome("DeleteAddressSpace", config_pb2.DeleteRequest(ref=Ref(name=A)))
            == OK
        )
    log = (config.workdir / "config.log").read_text()
    assert "AUTH IS OFF: the ConfigService port is open" in log


async def test_a_bootstrap_file_does_not_bring_back_an_admin_while_one_lives(
    etcd: EtcdProcess,
    etcd_prefix: str,
    config_process_factory: Callable[..., ConfigProcess],
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text("first-admin-token-0123456789-0123456789\n")
    second.write_text("second-admin-token-0123456789-0123456789\n")
    one = config_process_factory(
        etcd_endpoint=etcd.endpoint,
        prefix=etcd_prefix,
        extra_args=[f"--bootstrap-token-file={first}"],
    )
    one.stop()
    two = config_process_factory(
        etcd_endpoint=etcd.endpoint,
        prefix=etcd_prefix,
        extra_args=[f"--bootstrap-token-file={second}"],
    )
    async with grpc.aio.insecure_channel(two.target) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        plans = config_pb2.ListRequest()
        kept, ignored = Caller(stub, first.read_text().strip()), Caller(stub, second.read_text())
        assert await kept.outcome("ListAddressPlans", plans) == OK
        assert await ignored.outcome("ListAddressPlans", plans) == (
            "UNAUTHENTICATED",
            "unknown token",
        )
    two.stop()
