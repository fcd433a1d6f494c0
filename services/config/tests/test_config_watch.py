"""Watch: list then changes, resume from a revision, filters, and no lies across restarts.

The restart tests SIGKILL real processes (the config service, etcd) and assert the exact event
sequence a client sees: nothing missed, nothing repeated. The spaces here use plans whose queues
name no dead-letter address (`plain_plans`), so the events are the test's own, without the `DLQ`
queue a space gets with its first queue of a default plan.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from enmasse.resources.informer import Informer
from enmasse.resources.kinds import object_of
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.config_service import start_in_process, stop_in_process

Ref = config_pb2.ObjectRef
Event = config_pb2.WatchEvent
NAMES = {Event.ADDED: "ADDED", Event.MODIFIED: "MODIFIED", Event.DELETED: "DELETED"}


def space(name: str) -> resources_pb2.AddressSpace:
    return resources_pb2.AddressSpace(
        metadata={"name": name}, spec={"type": "standard", "plan": "plain"}
    )


async def plain_plans(stub: config_pb2_grpc.ConfigServiceStub) -> None:
    """A space plan `plain` of queue plans that name no dead-letter address."""
    for name, credit in (("plain-queue", 0.01), ("plain-large-queue", 1)):
        await stub.CreateAddressPlan(
            resources_pb2.AddressPlan(
                metadata={"name": name}, spec={"address_type": "queue", "broker": credit}
            )
        )
    await stub.CreateAddressSpacePlan(
        resources_pb2.AddressSpacePlan(
            metadata={"name": "plain"},
            spec={
                "address_space_type": "standard",
                "address_plans": ["plain-queue", "plain-large-queue"],
            },
        )
    )


def queue(
    name: str, *, space_name: str = "shop", plan: str = "plain-queue"
) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata={"name": name, "space": space_name},
        spec={"address": name, "type": "queue", "plan": plan},
    )


async def take(call, count: int, *, within: float = 15.0) -> list[config_pb2.WatchEvent]:
    """The next `count` events of a watch call, bounded in time."""
    out = []
    async with asyncio.timeout(within):
        while len(out) < count:
            event = await call.read()
            if event.type != Event.PROGRESS:  # no change, only a resume point
                out.append(event)
    return out


def seen(events) -> list[tuple[str, str]]:
    return [(NAMES[e.type], object_of(e.object).metadata.name) for e in events]


async def until_serving(stub, *, within: float = 30.0) -> None:
    """Waits (bounded) until the service answers reads again after a restart."""
    deadline = time.monotonic() + within
    while True:
        try:
            await stub.ListAddressSpaces(config_pb2.ListRequest(), timeout=2)
            return
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_list_then_synced_then_changes(config_stub) -> None:
    await plain_plans(config_stub)
    await config_stub.CreateAddressSpace(space("shop"))
    first = await config_stub.CreateAddress(queue("q1"))
    call = config_stub.Watch(
        config_pb2.WatchRequest(kinds=["Address", "AddressSpace"], space="shop")
    )
    listed = await take(call, 3)
    assert sorted(seen(listed[:2])) == [("ADDED", "q1"), ("ADDED", "shop")]
    assert listed[2].type == Event.SYNCED
    assert listed[2].revision >= first.metadata.resource_version

    second = await config_stub.CreateAddress(queue("q2"))
    second.spec.plan = "plain-large-queue"
    modified = await config_stub.UpdateAddress(second)
    deleted = await config_stub.DeleteAddress(
        config_pb2.DeleteRequest(ref=Ref(space="shop", name="q1"))
    )
    changes = await take(call, 3)
    call.cancel()
    assert seen(changes) == [("ADDED", "q2"), ("MODIFIED", "q2"), ("DELETED", "q1")]
    assert [e.revision for e in changes] == [
        second.metadata.resource_version,
        modified.metadata.resource_version,
        deleted.revision,
    ]
    assert changes[1].object.address.spec.plan == "plain-large-queue"
    assert changes[2].object.address.spec.address == "q1", "DELETED carries the object as it was"


async def test_resume_from_revision_gets_exactly_the_later_changes(config_stub) -> None:
    await plain_plans(config_stub)
    await config_stub.CreateAddressSpace(space("shop"))
    marks = []
    for name in ("a", "b", "c", "d"):
        marks.append((await config_stub.CreateAddress(queue(name))).metadata.resource_version)
    call = config_stub.Watch(config_pb2.WatchRequest(kinds=["Address"], resource_version=marks[1]))
    events = await take(call, 2)
    call.cancel()
    assert seen(events) == [("ADDED", "c"), ("ADDED", "d")]
    assert [e.revision for e in events] == marks[2:]


async def test_filters_by_kind_and_space(config_stub) -> None:
    await plain_plans(config_stub)
    await config_stub.CreateAddressSpace(space("a"))
    await config_stub.CreateAddressSpace(space("b"))
    call = config_stub.Watch(config_pb2.WatchRequest(kinds=["Address"], space="b"))
    assert (await take(call, 1))[0].type == Event.SYNCED
    await config_stub.CreateAddress(queue("in-a", space_name="a"))
    await config_stub.CreateAddress(queue("in-b", space_name="b"))
    events = await take(call, 1)
    call.cancel()
    assert seen(events) == [("ADDED", "in-b")]


async def test_unknown_kind_is_refused(config_stub) -> None:
    call = config_stub.Watch(config_pb2.WatchRequest(kinds=["Queue"]))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await take(call, 1)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == (
        "kinds: 'Queue' is not a kind (one of AddressSpacePlan, AddressPlan, AddressSpace, "
        "Address, MessagingUser)"
    )


async def test_cascade_delete_streams_every_deletion(config_stub) -> None:
    await plain_plans(config_stub)
    await config_stub.CreateAddressSpace(space("shop"))
    await config_stub.CreateAddress(queue("q1"))
    await config_stub.CreateAddress(queue("q2"))
    call = config_stub.Watch(
        config_pb2.WatchRequest(kinds=["Address", "AddressSpace"], space="shop")
    )
    assert (await take(call, 4))[-1].type == Event.SYNCED
    deleted = await config_stub.DeleteAddressSpace(config_pb2.DeleteRequest(ref=Ref(name="shop")))
    events = await take(call, 3)
    call.cancel()
    assert sorted(seen(events)) == [("DELETED", "q1"), ("DELETED", "q2"), ("DELETED", "shop")]
    revision = deleted.revision
    assert [e.revision for e in events] == [revision - 1, revision - 1, revision], (
        "one transaction; only its last event is a resume point past it"
    )


class Recorder:
    """Informer handlers that write down what they were told, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.changed = asyncio.Event()

    def record(self, what: str, resource: resources_pb2.Resource) -> None:
        self.calls.append((what, object_of(resource).metadata.name))
        self.changed.set()

    def informer(self, target, **options) -> Informer:
        return Informer(
            target=target,
            on_added=lambda r: self.record("added", r),
            on_modified=lambda r: self.record("modified", r),
            on_deleted=lambda r: self.record("deleted", r),
            initial_backoff=0.05,
            max_backoff=0.5,
            **options,
        )

    async def until(self, count: int, *, within: float = 30.0) -> None:
        async with asyncio.timeout(within):
            while len(self.calls) < count:
                self.changed.clear()
                await self.changed.wait()


@pytest.mark.slow
async def test_informer_across_config_sigkill_and_restart(
    etcd, etcd_prefix, config_process_factory
) -> None:
    config = config_process_factory(etcd_endpoint=etcd.endpoint, prefix=etcd_prefix)
    async with grpc.aio.insecure_channel(config.target) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        await plain_plans(stub)
        await stub.CreateAddressSpace(space("shop"))
        await stub.CreateAddress(queue("before"))
    recorder = Recorder()
    informer = recorder.informer(lambda: config.target, kinds=["Address"], space="shop")
    informer.start()
    try:
        async with asyncio.timeout(15):
            await informer.synced.wait()
        config.kill()
        config.start()  # same port, new process
        async with grpc.aio.insecure_channel(config.target) as channel:
            stub = config_pb2_grpc.ConfigServiceStub(channel)
            await until_serving(stub)
            after = await stub.CreateAddress(queue("after"))
            after.spec.plan = "plain-large-queue"
            await stub.UpdateAddress(after)
            await stub.DeleteAddress(config_pb2.DeleteRequest(ref=Ref(space="shop", name="before")))
            await recorder.until(4)
            await asyncio.sleep(0.3)  # room for a (wrong) repeated event to show up
    finally:
        await informer.stop()
    assert recorder.calls == [
        ("added", "before"),
        ("added", "after"),
        ("modified", "after"),
        ("deleted", "before"),
    ]
    assert informer.reconnects >= 1
    assert [object_of(r).metadata.name for r in informer.list("Address")] == ["after"]


@pytest.mark.slow
async def test_watch_across_etcd_sigkill_and_restart(fresh_etcd, etcd_prefix) -> None:
    config = await start_in_process(etcd_endpoint=fresh_etcd.endpoint, prefix=etcd_prefix)
    recorder = Recorder()
    informer = recorder.informer(config.target, kinds=["Address"])
    try:
        async with grpc.aio.insecure_channel(config.target) as channel:
            stub = config_pb2_grpc.ConfigServiceStub(channel)
            await plain_plans(stub)
            await stub.CreateAddressSpace(space("shop"))
            await stub.CreateAddress(queue("q1"))
            raw = stub.Watch(config_pb2.WatchRequest(kinds=["Address"]))
            assert seen((await take(raw, 2))[:1]) == [("ADDED", "q1")]
            informer.start()
            async with asyncio.timeout(15):
                await informer.synced.wait()
            await stub.CreateAddress(queue("q2"))
            fresh_etcd.kill()
            fresh_etcd.start()
            await until_serving(stub)
            await stub.CreateAddress(queue("q3"))
            await stub.DeleteAddress(config_pb2.DeleteRequest(ref=Ref(space="shop", name="q1")))
            # the raw stream stays open: the service re-opened its etcd watch from where it was
            events = await take(raw, 3)
            raw.cancel()
            assert seen(events) == [("ADDED", "q2"), ("ADDED", "q3"), ("DELETED", "q1")]
            await recorder.until(4)
            await asyncio.sleep(0.3)
    finally:
        await informer.stop()
        await stop_in_process(config)
    assert recorder.calls == [("added", "q1"), ("added", "q2"), ("added", "q3"), ("deleted", "q1")]


async def test_compacted_revision_is_out_of_range_and_the_informer_relists(
    fresh_etcd, etcd_prefix
) -> None:
    config = await start_in_process(etcd_endpoint=fresh_etcd.endpoint, prefix=etcd_prefix)
    recorder = Recorder()
    informer = recorder.informer(config.target, kinds=["Address"])
    try:
        async with grpc.aio.insecure_channel(config.target) as channel:
            stub = config_pb2_grpc.ConfigServiceStub(channel)
            await plain_plans(stub)
            await stub.CreateAddressSpace(space("shop"))
            for name in ("keep", "change", "drop"):
                await stub.CreateAddress(queue(name))
            informer.start()
            async with asyncio.timeout(15):
                await informer.synced.wait()
            await recorder.until(3)
            await informer.stop()  # away for a while
            old = informer.revision
            changed = await stub.GetAddress(Ref(space="shop", name="change"))
            changed.spec.plan = "plain-large-queue"
            await stub.UpdateAddress(changed)
            await stub.DeleteAddress(config_pb2.DeleteRequest(ref=Ref(space="shop", name="drop")))
            await stub.CreateAddress(queue("new"))
            await config.store.compact(await config.store.revision())

            raw = stub.Watch(config_pb2.WatchRequest(resource_version=old))
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await take(raw, 1)
            assert error.value.code() == grpc.StatusCode.OUT_OF_RANGE
            assert error.value.details() == f"resource_version {old} has been compacted; re-list"

            informer.start()
            await recorder.until(6)
            await asyncio.sleep(0.2)
    finally:
        await informer.stop()
        await stop_in_process(config)
    assert recorder.calls[:3] == [("added", "change"), ("added", "drop"), ("added", "keep")]
    assert sorted(recorder.calls[3:]) == [
        ("added", "new"),
        ("deleted", "drop"),
        ("modified", "change"),
    ]
    assert informer.relists == 1
    assert [object_of(r).metadata.name for r in informer.list("Address")] == [
        "change",
        "keep",
        "new",
    ]


async def test_filtered_changes_still_move_the_resume_revision(config_stub, monkeypatch) -> None:
    from enmasse.config import watch

    monkeypatch.setattr(watch, "PROGRESS_EVERY", 0.0)
    await plain_plans(config_stub)
    await config_stub.CreateAddressSpace(space("a"))
    await config_stub.CreateAddressSpace(space("b"))
    call = config_stub.Watch(config_pb2.WatchRequest(kinds=["Address"], space="b"))
    assert (await call.read()).type == Event.SYNCED
    elsewhere = await config_stub.CreateAddress(queue("in-a", space_name="a"))
    async with asyncio.timeout(15):
        progress = await call.read()
    call.cancel()
    assert progress.type == Event.PROGRESS
    assert progress.revision == elsewhere.metadata.resource_version


async def test_informer_view_and_a_failing_handler(config_server, config_stub) -> None:
    await plain_plans(config_stub)
    await config_stub.CreateAddressSpace(space("shop"))
    seen_names: list[str] = []
    done = asyncio.Event()

    def on_added(resource: resources_pb2.Resource) -> None:
        name = object_of(resource).metadata.name
        seen_names.append(name)
        if name == "after":
            done.set()
        if name == "boom":
            raise RuntimeError("a controller bug")

    informer = Informer(target=config_server.target, kinds=["Address"], on_added=on_added)
    informer.start()
    try:
        async with asyncio.timeout(15):
            await informer.synced.wait()
        await config_stub.CreateAddress(queue("boom"))
        last = await config_stub.CreateAddress(queue("after"))
        async with asyncio.timeout(15):
            await done.wait()
    finally:
        await informer.stop()
    assert seen_names == ["boom", "after"]
    got = informer.get("Address", "after", space="shop")
    assert got is not None
    assert got.address.metadata.resource_version == last.metadata.resource_version
    assert [object_of(r).metadata.name for r in informer.list("Address", space="shop")] == [
        "after",
        "boom",
    ]
    assert informer.list("Address", space="elsewhere") == []


async def test_informer_cut_inside_a_transaction_replays_it_without_repeats(
    config_server, config_stub
) -> None:
    await plain_plans(config_stub)
    await config_stub.CreateAddressSpace(space("shop"))
    for name in ("q1", "q2", "q3"):
        await config_stub.CreateAddress(queue(name))
    recorder = Recorder()
    informer = recorder.informer(config_server.target, kinds=["Address"])
    informer.start()
    try:
        async with asyncio.timeout(15):
            await informer.synced.wait()
        deleted = await config_stub.DeleteAddressSpace(
            config_pb2.DeleteRequest(ref=Ref(name="shop"))
        )
        await recorder.until(6)
        await informer.stop()
        # as if the stream broke after the first deletion: its resume point is before the txn
        informer.revision = deleted.revision - 1
        informer._cache[("Address", "shop", "q3")] = resource_of_address("q3")
        informer.start()
        await recorder.until(7)
        await asyncio.sleep(0.3)  # room for a (wrong) repeated event to show up
    finally:
        await informer.stop()
    assert recorder.calls[:3] == [("added", "q1"), ("added", "q2"), ("added", "q3")]
    assert sorted(recorder.calls[3:6]) == [("deleted", "q1"), ("deleted", "q2"), ("deleted", "q3")]
    assert recorder.calls[6:] == [("deleted", "q3")], "only what the cache still held is told again"
    assert informer.list("Address") == []


def resource_of_address(name: str) -> resources_pb2.Resource:
    return resources_pb2.Resource(address=queue(name))
