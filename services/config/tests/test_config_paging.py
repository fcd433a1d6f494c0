"""Paged List and Watch, and Apply in several transactions, against etcd's default limits.

Every test here runs against an etcd of its own with etcd's default --max-txn-ops (128) and
--max-request-bytes (1.5 MiB), the limits a stock etcd has, so an Apply of thousands of
addresses must be cut into transactions, and a List of them into pages. What is asserted is what
a client sees: every object exactly once across pages (while writes happen between them), the
exact OUT_OF_RANGE of an expired continue token, a watch cut in its list phase and in its
changes by SIGKILLs of the real config process that misses and repeats nothing, and an Apply
that fails part-way saying how far it got and converging when applied again.
"""
# ruff: noqa: E501  (the exact messages read best on one line each)

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from enmasse.common.credentials import bearer_metadata
from enmasse.common.serving import start_server
from enmasse.config.servicer import ConfigServicer
from enmasse.config.store import Commit, Part, Store, StoreUnavailable
from enmasse.resources.informer import Informer
from enmasse.resources.kinds import key_of, object_of, resource_of
from enmasse.resources.paging import every_item_async
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.config_service import InProcessConfig, start_in_process, stop_in_process
from tests.fixtures.etcd import EtcdProcess

Event = config_pb2.WatchEvent
Action = config_pb2.ApplyResult.Action
Ref = config_pb2.ObjectRef
SPACE = "shop"
PLAN = "unlimited"  # the default space plans cap pooled queues by broker credit
ETCD_DEFAULTS = ["--max-txn-ops=128", "--max-request-bytes=1572864"]


@pytest.fixture(scope="module")
def stock_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """An etcd with etcd's own default limits (the shared fixture raises them)."""
    server = EtcdProcess(
        data_dir=tmp_path_factory.mktemp("stock-etcd") / "data", extra_args=ETCD_DEFAULTS
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
async def config(stock_etcd: EtcdProcess, etcd_prefix: str) -> AsyncIterator[InProcessConfig]:
    running = await start_in_process(etcd_endpoint=stock_etcd.endpoint, prefix=etcd_prefix)
    try:
        yield running
    finally:
        await stop_in_process(running)


@pytest.fixture
async def stub(config: InProcessConfig) -> AsyncIterator[config_pb2_grpc.ConfigServiceStub]:
    async with grpc.aio.insecure_channel(config.target) as channel:
        yield config_pb2_grpc.ConfigServiceStub(channel)


def queue(name: str) -> resources_pb2.Resource:
    return resource_of(
        resources_pb2.Address(
            metadata={"name": name, "space": SPACE},
            spec={"address": name, "type": "queue", "plan": "standard-small-queue"},
        )
    )


def space() -> resources_pb2.Resource:
    return resource_of(
        resources_pb2.AddressSpace(
            metadata={"name": SPACE}, spec={"type": "standard", "plan": PLAN}
        )
    )


async def unlimited_plan(stub) -> None:
    await stub.CreateAddressSpacePlan(
        resources_pb2.AddressSpacePlan(
            metadata={"name": PLAN},
            spec={
                "address_space_type": "standard",
                "address_plans": ["standard-small-queue", "standard-large-queue"],
            },
        )
    )


async def apply(stub, resources) -> config_pb2.ApplyResponse:
    request = config_pb2.ApplyRequest(space=SPACE, manager="gitops", resources=resources)
    return await stub.Apply(request, timeout=120)


async def space_of(stub, count: int) -> config_pb2.ApplyResponse:
    """The space with queues q0000..q<count-1> (and its DLQ), in one Apply."""
    await unlimited_plan(stub)
    return await apply(stub, [space(), *(queue(f"q{n:04}") for n in range(count))])


async def listed_names(stub, *, space_name: str = SPACE) -> list[str]:
    items = await every_item_async(stub.ListAddresses, config_pb2.ListRequest(space=space_name))
    return [a.metadata.name for a in items]


def counts(response: config_pb2.ApplyResponse) -> dict[str, int]:
    out: dict[str, int] = {}
    for result in response.results:
        out[Action.Name(result.action)] = out.get(Action.Name(result.action), 0) + 1
    return out


# ---------------------------------------------------------------- Apply at etcd's default limits


async def test_an_apply_of_3000_addresses_fits_etcd_default_limits(stub) -> None:
    before = (await stub.ListAddressSpaces(config_pb2.ListRequest())).revision
    applied = await space_of(stub, 3000)
    assert counts(applied) == {"CREATED": 3002}  # the space, 3,000 queues, the space's DLQ
    assert applied.revision - before >= 3002 // 127, "in transactions of at most 127 writes"
    names = await listed_names(stub)
    assert sorted(names) == sorted([f"q{n:04}" for n in range(3000)] + ["dlq"])
    again = await apply(stub, [space(), *(queue(f"q{n:04}") for n in range(3000))])
    assert counts(again) == {"UNCHANGED": 3001}
    assert again.revision == applied.revision, "nothing unchanged is written"


class FailingStore(Store):
    """A real store whose `fail_at`-th transaction of an Apply finds etcd gone, or whose
    `intrude_at`-th finds that another writer (another config process) wrote just before it."""

    fail_at = 0
    intrude_at = 0
    parts_seen = 0

    async def commit_part(self, part: Part, *, guard: int) -> int | None:
        self.parts_seen += 1
        if self.parts_seen == self.fail_at:
            raise StoreUnavailable("etcd: UNAVAILABLE: connection reset")
        if self.parts_seen == self.intrude_at:
            intruder = object_of(queue("intruder"))
            assert await self.commit(Commit(puts={key_of(intruder): intruder}), guard=guard)
        return await super().commit_part(part, guard=guard)


@pytest.fixture
async def failing(stock_etcd, etcd_prefix) -> AsyncIterator[tuple[FailingStore, object]]:
    """(the store, a stub) of a config service in this process over a FailingStore."""
    store = FailingStore(endpoints=[stock_etcd.endpoint], prefix=etcd_prefix)
    servicer = ConfigServicer(store)
    await servicer.seed_default_plans()
    running = await start_server(
        registrations=[
            (
                config_pb2_grpc.add_ConfigServiceServicer_to_server,
                servicer,
                "enmasse.v1.ConfigService",
            )
        ]
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield store, config_pb2_grpc.ConfigServiceStub(channel)
    finally:
        await running.stop(grace=0.5)
        await servicer.close()
        await store.close()


async def test_an_apply_failing_part_way_says_how_far_and_converges_when_applied_again(
    failing,
) -> None:
    store, stub = failing
    await unlimited_plan(stub)
    batch = [space(), *(queue(f"q{n:04}") for n in range(1000))]
    store.parts_seen, store.fail_at = 0, 3
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await apply(stub, batch)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error.value.details() == (
        "the store failed part-way: etcd: UNAVAILABLE: connection reset; 254 of the 1002 "
        "writes of this apply were committed; apply the same batch again to finish it"
    )
    # what went in: the first two transactions, the space first, queues in order
    assert sorted(await listed_names(stub)) == [f"q{n:04}" for n in range(253)]
    assert (await stub.GetAddressSpace(Ref(name=SPACE))).metadata.name == SPACE

    again = await apply(stub, batch)
    assert counts(again) == {"UNCHANGED": 254, "CREATED": 748}
    created = [r.ref.name for r in again.results if r.action == Action.CREATED]
    assert created == [f"q{n:04}" for n in range(253, 1000)] + ["dlq"]
    assert sorted(await listed_names(stub)) == sorted([f"q{n:04}" for n in range(1000)] + ["dlq"])


async def test_a_write_between_two_transactions_of_an_apply_is_kept_and_the_rest_goes_on(
    failing,
) -> None:
    store, stub = failing
    await unlimited_plan(stub)
    batch = [space(), *(queue(f"q{n:04}") for n in range(1000))]
    store.parts_seen, store.intrude_at = 0, 2  # after the first transaction, before the second
    applied = await apply(stub, batch)
    assert counts(applied) == {"CREATED": 1002}, "what each object became, across the re-plan"
    assert [r.ref.name for r in applied.results][-2:] == ["q0999", "dlq"]
    assert sorted(await listed_names(stub)) == sorted(
        [f"q{n:04}" for n in range(1000)] + ["dlq", "intruder"]
    )


# ---------------------------------------------------------------- List pages


async def test_pages_have_a_default_and_a_maximum_size(stub) -> None:
    await space_of(stub, 1200)
    first = await stub.ListAddresses(config_pb2.ListRequest(space=SPACE))
    assert len(first.items) == 500
    assert first.continue_token
    largest = await stub.ListAddresses(config_pb2.ListRequest(space=SPACE, limit=5000))
    assert len(largest.items) == 1000
    assert largest.continue_token
    last = await stub.ListAddresses(
        config_pb2.ListRequest(space=SPACE, limit=5000, continue_token=largest.continue_token)
    )
    assert len(last.items) == 201  # 1,200 queues and the DLQ
    assert not last.continue_token
    assert last.revision == largest.revision


async def test_a_list_across_pages_is_one_snapshot_while_writes_happen(stub) -> None:
    await space_of(stub, 1200)
    snapshot = set(await listed_names(stub))
    request = config_pb2.ListRequest(space=SPACE, limit=300)
    pages: list[list[str]] = []
    versions: list[int] = []
    plans: set[str] = set()
    reply = await stub.ListAddresses(request)
    revision = reply.revision
    while True:
        pages.append([a.metadata.name for a in reply.items])
        versions.extend(a.metadata.resource_version for a in reply.items)
        plans.update(a.spec.plan for a in reply.items)
        if not reply.continue_token:
            break
        # between pages: delete one listed and one not yet listed, create one, update one
        n = len(pages)
        await stub.DeleteAddress(config_pb2.DeleteRequest(ref=Ref(space=SPACE, name=pages[-1][1])))
        ahead = f"q{min(300 * n + 150, 1199):04}"  # on a page still to come
        await stub.DeleteAddress(config_pb2.DeleteRequest(ref=Ref(space=SPACE, name=ahead)))
        await stub.CreateAddress(object_of(queue(f"new{n}")))
        changed = await stub.GetAddress(Ref(space=SPACE, name=f"q{min(300 * n + 10, 1190):04}"))
        changed.spec.plan = "standard-large-queue"
        await stub.UpdateAddress(changed)
        request.continue_token = reply.continue_token
        reply = await stub.ListAddresses(request)
        assert reply.revision == revision, "every page is read at the first page's revision"
    names = [name for page in pages for name in page]
    assert [len(p) for p in pages] == [300, 300, 300, 300, 1]
    assert len(names) == len(set(names)), "no object twice"
    assert set(names) == snapshot, "none missed, none from after the snapshot"
    assert max(versions) <= revision
    assert plans == {"standard-small-queue"}, "as listed before the updates"
    now = set(await listed_names(stub))
    assert {f"new{n}" for n in range(1, 5)} <= now


async def test_an_expired_continue_token_is_out_of_range_saying_restart(stub, config) -> None:
    await space_of(stub, 700)
    first = await stub.ListAddresses(config_pb2.ListRequest(space=SPACE))
    await stub.CreateAddress(object_of(queue("later")))
    await config.store.compact(await config.store.revision())
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.ListAddresses(
            config_pb2.ListRequest(space=SPACE, continue_token=first.continue_token)
        )
    assert error.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert error.value.details() == (
        f"continue_token expired: store revision {first.revision} has been compacted; "
        "restart the list without a continue_token"
    )
    assert len(await listed_names(stub)) == 702, "a list restarted from the first page works"


async def test_a_token_of_another_list_or_no_token_at_all_is_invalid(stub) -> None:
    await space_of(stub, 600)
    addresses = await stub.ListAddresses(config_pb2.ListRequest(space=SPACE))
    for call, token, message in [
        (stub.ListAddresses, "not-a-token", "continue_token: not a continue token"),
        (
            stub.ListMessagingUsers,
            addresses.continue_token,
            f"continue_token: belongs to another list (List/Address/{SPACE}), not to List/MessagingUser/{SPACE}",
        ),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call(config_pb2.ListRequest(space=SPACE, continue_token=token))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.value.details() == message


# ---------------------------------------------------------------- Watch: list phase in chunks


async def read_until(call, stop, *, within: float = 30.0) -> list[config_pb2.WatchEvent]:
    """Events of `call` (PROGRESS left out) up to the first for which `stop(events)` holds."""
    out: list[config_pb2.WatchEvent] = []
    async with asyncio.timeout(within):
        while not out or not stop(out):
            event = await call.read()
            if event.type != Event.PROGRESS:
                out.append(event)
    call.cancel()
    return out


async def until_serving(stub, *, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            await stub.ListAddressSpaces(config_pb2.ListRequest(), timeout=2)
            return
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def name(event: config_pb2.WatchEvent) -> str:
    return object_of(event.object).metadata.name


@pytest.mark.slow
async def test_a_paged_watch_across_config_sigkills_misses_and_repeats_nothing(
    stock_etcd, etcd_prefix, config_process_factory, tmp_path: Path
) -> None:
    process = config_process_factory(etcd_endpoint=stock_etcd.endpoint, prefix=etcd_prefix)
    async with grpc.aio.insecure_channel(process.target) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        await space_of(stub, 1500)
    at_list = {f"q{n:04}" for n in range(1500)} | {"dlq"}
    watch = config_pb2.WatchRequest(kinds=["Address"], space=SPACE)

    # the list phase, cut after 700 objects (more than one chunk of 500) by a SIGKILL
    async with grpc.aio.insecure_channel(process.target) as channel:
        call = config_pb2_grpc.ConfigServiceStub(channel).Watch(watch)
        first = await read_until(call, lambda events: len(events) == 700)
    assert {e.type for e in first} == {Event.ADDED}
    assert all(e.continue_token for e in first)
    process.kill()
    process.start()
    async with grpc.aio.insecure_channel(process.target) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        await until_serving(stub)
        # written after the list's revision: not in the list, but in the changes after it
        await stub.DeleteAddress(config_pb2.DeleteRequest(ref=Ref(space=SPACE, name="q0001")))
        await stub.DeleteAddress(config_pb2.DeleteRequest(ref=Ref(space=SPACE, name="q1400")))
        created = await stub.CreateAddress(object_of(queue("after")))
        watch.continue_token = first[-1].continue_token
        rest = await read_until(stub.Watch(watch), lambda events: events[-1].type == Event.DELETED)
    listed = [name(e) for e in first] + [name(e) for e in rest if e.type == Event.ADDED]
    assert len(listed) == len(set(listed)), "nothing listed twice"
    assert set(listed) == at_list, "the list is the snapshot it began: none missed"
    synced = next(e for e in rest if e.type == Event.SYNCED)
    assert synced.revision < created.metadata.resource_version
    changes = [(Event.Type.Name(e.type), name(e)) for e in rest[rest.index(synced) + 1 :]]
    assert changes[0] == ("DELETED", "q0001")

    # the changes, cut by another SIGKILL: resumed from the last revision seen
    process.kill()
    process.start()
    async with grpc.aio.insecure_channel(process.target) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        await until_serving(stub)
        resume = config_pb2.WatchRequest(
            kinds=["Address"], space=SPACE, resource_version=rest[-1].revision
        )
        more = await read_until(
            stub.Watch(resume),
            lambda events: len(changes) + len(events) >= 3,
        )
    changes += [(Event.Type.Name(e.type), name(e)) for e in more]
    assert changes == [("DELETED", "q0001"), ("DELETED", "q1400"), ("ADDED", "after")]
    async with grpc.aio.insecure_channel(process.target) as channel:
        now = await listed_names(config_pb2_grpc.ConfigServiceStub(channel))
    assert set(now) == (at_list - {"q0001", "q1400"}) | {"after"}


async def test_an_expired_watch_continue_token_is_out_of_range(stub, config) -> None:
    await space_of(stub, 600)
    call = stub.Watch(config_pb2.WatchRequest(kinds=["Address"], space=SPACE))
    first = await read_until(call, lambda events: len(events) == 10)
    await stub.CreateAddress(object_of(queue("later")))
    await config.store.compact(await config.store.revision())
    resumed = stub.Watch(
        config_pb2.WatchRequest(
            kinds=["Address"], space=SPACE, continue_token=first[-1].continue_token
        )
    )
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await read_until(resumed, lambda events: False, within=10)
    assert error.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert error.value.details().startswith("continue_token expired: store revision ")
    assert error.value.details().endswith(
        " has been compacted; restart the list without a continue_token"
    )


async def test_a_scoped_callers_pages_and_tokens_name_only_its_own_spaces(
    stock_etcd, etcd_prefix, config_process_factory, tmp_path: Path
) -> None:
    admin_token = "the-bootstrap-admin-token-of-this-test-0123456789"
    (tmp_path / "admin-token").write_text(admin_token + "\n")
    process = config_process_factory(
        etcd_endpoint=stock_etcd.endpoint,
        prefix=etcd_prefix,
        extra_args=[f"--bootstrap-token-file={tmp_path / 'admin-token'}"],
    )
    admin = bearer_metadata(admin_token)
    async with grpc.aio.insecure_channel(process.target) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        await until_serving_as(stub, admin)
        await stub.CreateAddressSpacePlan(
            resources_pb2.AddressSpacePlan(
                metadata={"name": PLAN},
                spec={"address_space_type": "standard", "address_plans": ["standard-small-queue"]},
            ),
            metadata=admin,
        )
        for name in ("a", "b", "c"):  # keys sort a, b, c: b's lie between the viewer's two
            batch = [
                resource_of(
                    resources_pb2.AddressSpace(
                        metadata={"name": name}, spec={"type": "standard", "plan": PLAN}
                    )
                ),
                *(
                    resource_of(
                        resources_pb2.Address(
                            metadata={"name": f"{name}-secret-{n:02}", "space": name},
                            spec={
                                "address": f"x{n}",
                                "type": "queue",
                                "plan": "standard-small-queue",
                            },
                        )
                    )
                    for n in range(30)
                ),
            ]
            await stub.Apply(
                config_pb2.ApplyRequest(space=name, manager="gitops", resources=batch),
                metadata=admin,
            )
        made = await stub.CreateToken(
            config_pb2.CreateTokenRequest(name="viewer-ac", role="viewer", spaces=["a", "c"]),
            metadata=admin,
        )
        viewer = bearer_metadata(made.secret)
        request = config_pb2.ListRequest(limit=31)  # every space: a's 31 fill the first page
        names: list[str] = []
        tokens: list[str] = []
        while True:
            reply = await stub.ListAddresses(request, metadata=viewer)
            names += [f"{a.metadata.space}/{a.metadata.name}" for a in reply.items]
            if not reply.continue_token:
                break
            tokens.append(reply.continue_token)
            request.continue_token = reply.continue_token
    expected = [f"{s}/{s}-secret-{n:02}" for s in "ac" for n in range(30)]
    assert sorted(names) == sorted([*expected, "a/dlq", "c/dlq"])
    assert len(names) == len(set(names))
    assert tokens, "more than one page"
    for token in tokens:
        assert b"Address/b/" not in base64.urlsafe_b64decode(token), "no key of space b"


async def until_serving_as(stub, metadata, *, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            await stub.ListAddressSpaces(config_pb2.ListRequest(), metadata=metadata, timeout=2)
            return
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_an_informer_cut_in_its_list_phase_resumes_the_list_not_starts_over(
    stock_etcd, etcd_prefix, config_process_factory
) -> None:
    process = config_process_factory(etcd_endpoint=stock_etcd.endpoint, prefix=etcd_prefix)
    async with grpc.aio.insecure_channel(process.target) as channel:
        await space_of(config_pb2_grpc.ConfigServiceStub(channel), 3000)
    calls: list[tuple[str, str]] = []
    informer = Informer(
        target=lambda: process.target,
        kinds=["Address"],
        space=SPACE,
        on_added=lambda r: calls.append(("added", object_of(r).metadata.name)),
        on_deleted=lambda r: calls.append(("deleted", object_of(r).metadata.name)),
    )
    informer.start()
    store = Store(endpoints=[stock_etcd.endpoint], prefix=etcd_prefix)
    try:
        for _ in range(15_000):  # the list phase under way (its progress is private)
            if len(informer._listing or {}) >= 300:
                break
            await asyncio.sleep(0.002)
        process.kill()
        assert not informer.synced.is_set(), "cut in the list phase"
        # while config is down: one object the cut list had, one it had not reached yet
        for gone in ("q0001", "q2900"):
            assert await store.commit(
                Commit(deletes=[("Address", SPACE, gone)]), guard=await store.guard_revision()
            )
        process.start()
        for _ in range(600):
            if len(calls) >= 3001 + 2:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # room for a (wrong) repeated call to show up
    finally:
        await informer.stop()
        await store.close()
    # resumed at the list's revision: all 3,001 as they were, then the two deletes as changes
    # (a list started over after the deletes would hold 2,999 and report no delete)
    added = [name for what, name in calls if what == "added"]
    assert sorted(added) == sorted([f"q{n:04}" for n in range(3000)] + ["dlq"])
    assert calls[-2:] == [("deleted", "q0001"), ("deleted", "q2900")]
    assert informer.reconnects >= 1
    assert informer.relists == 0
