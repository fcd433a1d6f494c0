"""The ConfigService gRPC servicer: a thin shell over the store and the write path.

In: the RPCs of `config.proto`. Out: resources, lists, watch events, apply results, or a gRPC
status with the exact message (`Refused` from the write path; UNAVAILABLE when etcd is away).

Every write goes the same way (`_write`): read the guard's revision G (the last write), take the
catalog once it has seen G (`enmasse.config.cache`), compute the commit with
`enmasse.config.writes` (which validates through `enmasse.resources.validation`), commit it in ONE
etcd transaction that compares the guard with G, and start over when somebody else wrote in
between. Writes are serialized in-process by one lock, so concurrent requests to this process
never race each other; the guard covers other processes.

A batch of status writes (`UpdateAddressStatuses`, the controllers' pass over a space) checks
every entry first, against one catalog, so a stale or missing entry refuses the call before
anything is written; it then commits in as many transactions as etcd's limits need
(`Store.commit_puts`), holding the write lock throughout, so no other write of this process
lands between them. Only another process writing to the same etcd (config runs as one replica)
could: the rest is then checked again on the new state and committed on top of it.

An Apply too large for one etcd transaction (more than 127 writes, or 1.5 MiB) is committed in
several (`Store.parts`: deletes first, then plans, spaces, addresses, subscriptions last, users),
one after the other under the write lock, so no other write of this process lands between them;
everything is validated first, against one catalog, as for any write. What it promises: watchers
may see the parts arrive one by one; if the store fails after some parts went in, the call fails
naming how many of its writes were committed ("... 254 of the 1002 writes of this apply were
committed; apply the same batch again to finish it"), and applying the same batch again
converges: what went in is UNCHANGED, the rest is written. An Apply that fits in one transaction
is all or nothing, as before. Lists and Watch's list phase read the store a page at a time, at
one revision (`enmasse.config.listing`).

Every RPC first passes the gate (`enmasse.config.gate`: the caller's token, what its role may do
in the space the call is about, the audit event); a List or Watch of every space shows a scoped
caller its own spaces only, an Apply is authorized as the writes it would make, and no answer
carries a secret field (a user's password hash), except a controller's Watch `with_secrets`.
The token RPCs (CreateToken, ListTokens, RevokeToken) are served here over `enmasse.config.tokens`.

What differs between kinds (the message a List answers with, whether an object is named by space
and name or by name alone, which fields are secret) is read from the one kinds table,
`enmasse.resources.kinds`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import structlog
from enmasse.config import writes
from enmasse.config.access import (
    LIST_RPCS,
    OPEN,
    WATCH_WITH_SECRETS,
    Decision,
    Identity,
    authorize,
    authorize_applied,
    first_refusal,
    sees,
    space_of,
    visible_spaces,
)
from enmasse.config.audit import OK, AuditLog
from enmasse.config.cache import CatalogCache
from enmasse.config.gate import Call, Gate
from enmasse.config.listing import list_page
from enmasse.config.store import Commit, Part, Store, StoreRefused, StoreUnavailable, TooLarge
from enmasse.config.tokens import Authenticator
from enmasse.config.watch import watch_events
from enmasse.config.writes import Refused
from enmasse.resources.kinds import KINDS, SPACE_SCOPED_KINDS, AnyObject, Key, key_of
from enmasse.resources.plans import load_default_plans
from enmasse.resources.status_batches import ENTRY_TRAILER
from enmasse.resources.validation import Catalog
from enmasse.v1 import config_pb2, config_pb2_grpc

log = structlog.get_logger(__name__)
T = TypeVar("T")
MAX_ATTEMPTS = 20
DEFAULTS_MANAGER = "enmasse-defaults"
_APPLIED_AS = {
    config_pb2.ApplyResult.CREATED: "Create",
    config_pb2.ApplyResult.UPDATED: "Update",
    config_pb2.ApplyResult.PRUNED: "Delete",
}


class ConfigServicer(config_pb2_grpc.ConfigServiceServicer):
    def __init__(self, store: Store, *, auth: bool = False, audit: AuditLog | None = None) -> None:
        """`auth`: every call must carry a token (`enmasse.config.gate`); without it every caller
        may do everything, as before there were tokens."""
        self.store = store
        self.cache = CatalogCache(store)
        self.tokens = Authenticator(store)
        self.gate = Gate(authenticator=self.tokens if auth else None, audit=audit or AuditLog())
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------ the common paths

    async def _write(self, compute: Callable[[Catalog], tuple[Commit, T]]) -> tuple[T, int]:
        async with self._lock:
            for _attempt in range(MAX_ATTEMPTS):
                guard = await self.store.guard_revision()
                catalog = await self.cache.at_least(guard)
                commit, answer = compute(catalog)  # no await inside: the catalog holds still
                if not commit:
                    return answer, guard
                revision = await self.store.commit(commit, guard=guard)
                if revision is not None:
                    return answer, revision
                log.info("store changed under a write, retrying", guard=guard)
        raise Refused(grpc.StatusCode.ABORTED, "the store kept changing under the write; retry")

    async def close(self) -> None:
        await self.cache.close()

    async def _serve(
        self,
        context: grpc.aio.ServicerContext,
        call: Call,
        run: Callable[[Identity], Awaitable[T]],
    ) -> T:
        """One RPC: the caller admitted at the gate, `run` as that caller, the write audited,
        and refusals and store outages turned into the gRPC status the caller sees."""
        identity: Identity | None = None
        outcome, reason = "", ""
        try:
            identity = await self.gate.admit(context, call)
            answer = await run(identity)
        except Refused as refused:
            outcome, reason = refused.code.name, refused.message
            await context.abort(refused.code, refused.message, trailing_metadata=refused.trailers)
        except StoreUnavailable as error:
            outcome, reason = "UNAVAILABLE", f"the store is unavailable: {error}"
            await context.abort(grpc.StatusCode.UNAVAILABLE, reason)
        except StoreRefused as error:
            outcome, reason = error.code.name, f"the store refused the request: {error.details}"
            await context.abort(error.code, reason)
        else:
            outcome = OK
            return answer
        finally:
            if identity is not None and call.writes and outcome:
                self.gate.wrote(identity, call, outcome=outcome, reason=reason, peer=context.peer())
        raise AssertionError("context.abort returns only by raising")

    async def _create(self, obj: AnyObject, context: grpc.aio.ServicerContext) -> Any:
        async def run(_identity: Identity) -> AnyObject:
            stored, revision = await self._write(
                lambda catalog: writes.plan_create(obj, catalog=catalog)
            )
            return _answer(stored, revision)

        return await self._serve(context, _call_on("Create", key_of(obj)), run)

    async def _update(self, obj: AnyObject, context: grpc.aio.ServicerContext) -> Any:
        async def run(_identity: Identity) -> AnyObject:
            stored, revision = await self._write(
                lambda catalog: writes.plan_update(obj, catalog=catalog)
            )
            return _answer(stored, revision)

        return await self._serve(context, _call_on("Update", key_of(obj)), run)

    async def _delete(
        self, kind: str, request: config_pb2.DeleteRequest, context: grpc.aio.ServicerContext
    ) -> config_pb2.DeleteResponse:
        async def run(_identity: Identity) -> config_pb2.DeleteResponse:
            key = _key(kind, request.ref)

            def compute(catalog: Catalog) -> tuple[Commit, None]:
                commit = writes.plan_delete(
                    key, resource_version=request.resource_version, catalog=catalog
                )
                return commit, None

            _, revision = await self._write(compute)
            log.info("deleted", kind=kind, space=key[1], name=key[2], revision=revision)
            return config_pb2.DeleteResponse(revision=revision)

        return await self._serve(context, _call_on("Delete", _named(kind, request.ref)), run)

    async def _status(
        self, kind: str, request: Any, context: grpc.aio.ServicerContext
    ) -> AnyObject:
        async def run(_identity: Identity) -> AnyObject:
            key = _key(kind, request.ref)
            stored, revision = await self._write(
                lambda catalog: writes.plan_status(
                    key,
                    status=request.status,
                    resource_version=request.resource_version,
                    catalog=catalog,
                ),
            )
            return _answer(stored, revision)

        key = _named(kind, request.ref)
        call = Call(f"Update{kind}Status", space=space_of(key), kind=kind, name=key[2])
        return await self._serve(context, call, run)

    async def _statuses(
        self, request: config_pb2.UpdateAddressStatusesRequest, context: grpc.aio.ServicerContext
    ) -> config_pb2.UpdateAddressStatusesResponse:
        rpc_name = "UpdateAddressStatuses"
        spaces = sorted({entry.ref.space for entry in request.entries})

        async def run(identity: Identity) -> config_pb2.UpdateAddressStatusesResponse:
            for space in spaces:  # the single RPC's rule, once per space the batch writes in
                decision = authorize(identity, rpc_name, space)
                if not decision.allowed:
                    raise Refused(grpc.StatusCode.PERMISSION_DENIED, decision.reason)
            batch = [
                _status_write(entry, index=i, total=len(request.entries))
                for i, entry in enumerate(request.entries)
            ]
            versions, revision = await self._write_batch(batch)
            log.info("statuses written", count=len(versions), revision=revision)
            return config_pb2.UpdateAddressStatusesResponse(
                revision=revision, resource_versions=versions
            )

        call = Call(rpc_name, space=spaces[0] if len(spaces) == 1 else "", kind="Address")
        return await self._serve(context, call, run)

    async def _write_batch(self, batch: list[writes.StatusWrite]) -> tuple[list[int], int]:
        """(each entry's new resource_version, the last revision); see the module docstring."""
        done: list[int] = []
        async with self._lock:
            for _attempt in range(MAX_ATTEMPTS):
                guard = await self.store.guard_revision()
                catalog = await self.cache.at_least(guard)
                try:
                    puts = writes.plan_statuses(
                        batch[len(done) :], catalog=catalog, total=len(batch)
                    )
                except Refused as refused:
                    written = f"{len(done)} of the batch were written" if done else "none written"
                    raise Refused(
                        refused.code, f"{refused.message}; {written}", trailers=refused.trailers
                    ) from refused
                if not puts:
                    return done, guard
                done.extend(await self.store.commit_puts(puts, guard=guard))
                if len(done) == len(batch):
                    return done, done[-1]
                log.info("store changed under a batch, going on", written=len(done))
        raise Refused(grpc.StatusCode.ABORTED, "the store kept changing under the write; retry")

    async def _get(
        self, kind: str, ref: config_pb2.ObjectRef, context: grpc.aio.ServicerContext
    ) -> Any:
        async def run(_identity: Identity) -> AnyObject:
            key = _key(kind, ref)
            obj = await self.store.get(key)
            if obj is None:
                raise Refused(grpc.StatusCode.NOT_FOUND, f"{writes.describe(key)} not found")
            return writes.public_form(obj)

        return await self._serve(context, _call_on("Get", _named(kind, ref)), run)

    async def _list(
        self, kind: str, request: config_pb2.ListRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        async def run(identity: Identity) -> Any:
            wanted = dict(request.label_selector)
            visible = visible_spaces(identity)

            def shown(obj: AnyObject) -> AnyObject | None:
                if not all(obj.metadata.labels.get(k) == v for k, v in wanted.items()):
                    return None
                return writes.public_form(obj) if sees(visible, key_of(obj)) else None

            page = await list_page(
                self.store,
                kind=kind,
                space=request.space if kind in SPACE_SCOPED_KINDS else "",
                limit=request.limit,
                continue_token=request.continue_token,
                shown=shown,
            )
            return KINDS[kind].list_message(
                items=page.items, revision=page.revision, continue_token=page.continue_token
            )

        space = request.space if kind in SPACE_SCOPED_KINDS else ""
        call = Call(LIST_RPCS[kind], space=space, kind=kind)
        return await self._serve(context, call, run)

    # ------------------------------------------------------------ plans

    async def CreateAddressSpacePlan(self, request, context):  # type: ignore[no-untyped-def]
        return await self._create(request, context)

    async def GetAddressSpacePlan(self, request, context):  # type: ignore[no-untyped-def]
        return await self._get("AddressSpacePlan", request, context)

    async def ListAddressSpacePlans(self, request, context):  # type: ignore[no-untyped-def]
        return await self._list("AddressSpacePlan", request, context)

    async def UpdateAddressSpacePlan(self, request, context):  # type: ignore[no-untyped-def]
        return await self._update(request, context)

    async def DeleteAddressSpacePlan(self, request, context):  # type: ignore[no-untyped-def]
        return await self._delete("AddressSpacePlan", request, context)

    async def CreateAddressPlan(self, request, context):  # type: ignore[no-untyped-def]
        return await self._create(request, context)

    async def GetAddressPlan(self, request, context):  # type: ignore[no-untyped-def]
        return await self._get("AddressPlan", request, context)

    async def ListAddressPlans(self, request, context):  # type: ignore[no-untyped-def]
        return await self._list("AddressPlan", request, context)

    async def UpdateAddressPlan(self, request, context):  # type: ignore[no-untyped-def]
        return await self._update(request, context)

    async def DeleteAddressPlan(self, request, context):  # type: ignore[no-untyped-def]
        return await self._delete("AddressPlan", request, context)

    # ------------------------------------------------------------ address spaces

    async def CreateAddressSpace(self, request, context):  # type: ignore[no-untyped-def]
        return await self._create(request, context)

    async def GetAddressSpace(self, request, context):  # type: ignore[no-untyped-def]
        return await self._get("AddressSpace", request, context)

    async def ListAddressSpaces(self, request, context):  # type: ignore[no-untyped-def]
        return await self._list("AddressSpace", request, context)

    async def UpdateAddressSpace(self, request, context):  # type: ignore[no-untyped-def]
        return await self._update(request, context)

    async def DeleteAddressSpace(self, request, context):  # type: ignore[no-untyped-def]
        return await self._delete("AddressSpace", request, context)

    async def UpdateAddressSpaceStatus(self, request, context):  # type: ignore[no-untyped-def]
        return await self._status("AddressSpace", request, context)

    # ------------------------------------------------------------ addresses

    async def CreateAddress(self, request, context):  # type: ignore[no-untyped-def]
        return await self._create(request, context)

    async def GetAddress(self, request, context):  # type: ignore[no-untyped-def]
        return await self._get("Address", request, context)

    async def ListAddresses(self, request, context):  # type: ignore[no-untyped-def]
        return await self._list("Address", request, context)

    async def UpdateAddress(self, request, context):  # type: ignore[no-untyped-def]
        return await self._update(request, context)

    async def DeleteAddress(self, request, context):  # type: ignore[no-untyped-def]
        return await self._delete("Address", request, context)

    async def UpdateAddressStatus(self, request, context):  # type: ignore[no-untyped-def]
        return await self._status("Address", request, context)

    async def UpdateAddressStatuses(self, request, context):  # type: ignore[no-untyped-def]
        return await self._statuses(request, context)

    # ------------------------------------------------------------ messaging users

    async def CreateMessagingUser(self, request, context):  # type: ignore[no-untyped-def]
        return await self._create(request, context)

    async def GetMessagingUser(self, request, context):  # type: ignore[no-untyped-def]
        return await self._get("MessagingUser", request, context)

    async def ListMessagingUsers(self, request, context):  # type: ignore[no-untyped-def]
        return await self._list("MessagingUser", request, context)

    async def UpdateMessagingUser(self, request, context):  # type: ignore[no-untyped-def]
        return await self._update(request, context)

    async def DeleteMessagingUser(self, request, context):  # type: ignore[no-untyped-def]
        return await self._delete("MessagingUser", request, context)

    # ------------------------------------------------------------ watch and apply

    async def Watch(
        self, request: config_pb2.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[config_pb2.WatchEvent]:
        call = Call("Watch", space=request.space)
        try:
            identity = await self.gate.admit(context, call)
            if request.with_secrets:
                self.gate.check(
                    identity, Call(WATCH_WITH_SECRETS, space=request.space), peer=context.peer()
                )
            visible = visible_spaces(identity)
            async for event in watch_events(self.store, request, visible=visible):
                yield event
        except Refused as refused:
            await context.abort(refused.code, refused.message)
        except StoreUnavailable as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error))

    async def Apply(
        self, request: config_pb2.ApplyRequest, context: grpc.aio.ServicerContext
    ) -> config_pb2.ApplyResponse:
        call = Call("Apply", space=request.space, name=request.manager)
        return await self._serve(
            context, call, lambda identity: self.apply(request, identity=identity)
        )

    async def apply(
        self, request: config_pb2.ApplyRequest, *, identity: Identity = OPEN
    ) -> config_pb2.ApplyResponse:
        """An Apply as `identity`: refused (PERMISSION_DENIED) as a whole when anything it would
        create, change or prune is not that identity's to write (a dry run too)."""

        def compute(catalog: Catalog) -> tuple[Commit, writes.ApplyPlan]:
            plan = writes.plan_apply(request, catalog=catalog)
            refusal = first_refusal(_applied_as(identity, plan.results))
            if not refusal.allowed:
                raise Refused(grpc.StatusCode.PERMISSION_DENIED, refusal.reason)
            return (Commit() if request.dry_run else plan.commit), plan

        plan, revision = await self._write_apply(compute)
        log.info(
            "applied",
            space=request.space,
            manager=request.manager,
            dry_run=request.dry_run,
            revision=revision,
            results=len(plan.results),
        )
        return config_pb2.ApplyResponse(results=plan.results, revision=revision)

    async def _write_apply(
        self, compute: Callable[[Catalog], tuple[Commit, writes.ApplyPlan]]
    ) -> tuple[writes.ApplyPlan, int]:
        """An Apply's writes: one transaction when they fit, else `Store.parts` one after the
        other under the write lock (see the module docstring for what a failure part-way
        leaves). Another process writing in between makes the rest planned again on the new
        state; the results still say what this Apply did to each object."""
        written: dict[Key, config_pb2.ApplyResult] = {}
        async with self._lock:
            for _attempt in range(MAX_ATTEMPTS):
                guard = await self.store.guard_revision()
                catalog = await self.cache.at_least(guard)
                commit, plan = compute(catalog)  # no await inside: the catalog holds still
                plan.results = _merged(plan.results, written)
                if not commit:
                    return plan, guard
                try:
                    parts = self.store.parts(commit)
                except TooLarge as error:
                    raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(error)) from error
                results = {_result_key(result): result for result in plan.results}
                total = len(written) + sum(len(part.keys) for part in parts)
                for part in parts:
                    revision = await self._commit_part(part, guard=guard, done=written, total=total)
                    if revision is None:
                        log.info("store changed under an apply, going on", written=len(written))
                        break
                    guard = revision
                    written.update((key, results[key]) for key in part.keys if key in results)
                else:
                    return plan, guard
        raise Refused(grpc.StatusCode.ABORTED, "the store kept changing under the write; retry")

    async def _commit_part(
        self, part: Part, *, guard: int, done: dict[Key, Any], total: int
    ) -> int | None:
        """One transaction of an Apply; a failure after others went in says how far it got."""
        try:
            return await self.store.commit_part(part, guard=guard)
        except (StoreUnavailable, StoreRefused) as error:
            if not done:
                raise  # nothing written: the store's own refusal, as for any write
            code = error.code if isinstance(error, StoreRefused) else grpc.StatusCode.UNAVAILABLE
            raise Refused(
                code,
                f"the store failed part-way: {error}; {len(done)} of the {total} writes of this "
                "apply were committed; apply the same batch again to finish it",
            ) from error

    async def seed_default_plans(self) -> int:
        """Stores the default plans when the store has none at all; how many it stored."""
        if await self.store.count("AddressPlan") or await self.store.count("AddressSpacePlan"):
            return 0
        request = config_pb2.ApplyRequest(manager=DEFAULTS_MANAGER, resources=load_default_plans())
        response = await self.apply(request)
        return sum(1 for r in response.results if r.action == config_pb2.ApplyResult.CREATED)

    async def create_space_queues(self) -> int:
        """Creates the dead-letter and expiry queues address spaces lack (a store written
        before the config service created them with the space); how many it created."""

        def compute(catalog: Catalog) -> tuple[Commit, list[writes.SpaceQueue]]:
            return writes.plan_space_queues(catalog=catalog)

        made, _ = await self._write(compute)
        for queue in made:
            where = queue.address.metadata
            if queue.violations:
                reason = "; ".join(str(v) for v in queue.violations)
                log.warning(
                    "space queue not created", space=where.space, why=queue.why, reason=reason
                )
            else:
                log.info(
                    "space queue created", space=where.space, address=where.name, why=queue.why
                )
        return sum(1 for queue in made if not queue.violations)

    # ------------------------------------------------------------ access tokens

    async def CreateToken(
        self, request: config_pb2.CreateTokenRequest, context: grpc.aio.ServicerContext
    ) -> config_pb2.CreateTokenResponse:
        async def run(identity: Identity) -> config_pb2.CreateTokenResponse:
            created = await self.tokens.create(request, created_by=identity.name)
            log.info("token created", name=request.name, role=request.role, by=identity.name)
            return created

        return await self._serve(context, Call("CreateToken", kind="Token", name=request.name), run)

    async def ListTokens(
        self, request: config_pb2.ListTokensRequest, context: grpc.aio.ServicerContext
    ) -> config_pb2.TokenList:
        async def run(_identity: Identity) -> config_pb2.TokenList:
            return config_pb2.TokenList(items=await self.tokens.list())

        return await self._serve(context, Call("ListTokens", kind="Token"), run)

    async def RevokeToken(
        self, request: config_pb2.RevokeTokenRequest, context: grpc.aio.ServicerContext
    ) -> config_pb2.Token:
        async def run(identity: Identity) -> config_pb2.Token:
            revoked = await self.tokens.revoke(request.name)
            log.info("token revoked", name=request.name, by=identity.name)
            return revoked

        return await self._serve(context, Call("RevokeToken", kind="Token", name=request.name), run)


def _result_key(result: config_pb2.ApplyResult) -> Key:
    return result.kind, result.ref.space, result.ref.name


def _merged(
    results: list[config_pb2.ApplyResult], written: dict[Key, config_pb2.ApplyResult]
) -> list[config_pb2.ApplyResult]:
    """The results of an Apply planned again after some of it was written: what the earlier
    transactions did (CREATED, not the UNCHANGED a re-plan sees), and their prunes and space
    queues, which a re-plan no longer lists."""
    merged = [
        written.get(key, result) if result.action == config_pb2.ApplyResult.UNCHANGED else result
        for result in results
        for key in [_result_key(result)]
    ]
    planned = {_result_key(result) for result in results}
    return merged + [result for key, result in written.items() if key not in planned]


def _applied_as(identity: Identity, results: list[config_pb2.ApplyResult]) -> list[Decision]:
    """Each write an Apply would make, as the single-object RPC it amounts to, authorized."""
    decisions = []
    for result in results:
        verb = _APPLIED_AS.get(result.action)
        if verb is not None:
            key = (result.kind, result.ref.space, result.ref.name)
            decisions.append(authorize_applied(identity, f"{verb}{result.kind}", space_of(key)))
    return decisions


def _status_write(
    entry: config_pb2.UpdateAddressStatusRequest, *, index: int, total: int
) -> writes.StatusWrite:
    try:
        key = _key("Address", entry.ref)
    except Refused as refused:
        raise Refused(
            refused.code,
            f"entries[{index}] of {total}: {refused.message}",
            trailers=((ENTRY_TRAILER, str(index)),),
        ) from refused
    return writes.StatusWrite(key, entry.status, entry.resource_version)


def _call_on(verb: str, key: Key) -> Call:
    return Call(f"{verb}{key[0]}", space=space_of(key), kind=key[0], name=key[2])


def _named(kind: str, ref: config_pb2.ObjectRef) -> Key:
    """The key a ref names, unchecked (for the gate: `_key` checks it inside the call)."""
    return kind, ref.space if kind in SPACE_SCOPED_KINDS else "", ref.name


def _answer(stored: AnyObject, revision: int) -> AnyObject:
    out = writes.public_form(stored)
    if out is stored:
        out = type(stored)()
        out.CopyFrom(stored)
    out.metadata.resource_version = revision
    return out


def _key(kind: str, ref: config_pb2.ObjectRef) -> Key:
    if not ref.name:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "ref.name must not be empty")
    if KINDS[kind].space_scoped:
        if not ref.space:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"ref.space must name the address space of the {kind}",
            )
        return kind, ref.space, ref.name
    return kind, "", ref.name
