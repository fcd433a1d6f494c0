"""`enmasse watch` and `enmasse get` against a store larger than one List page or list chunk.

A real config process over the session etcd (etcd's default limits): `ConfigClient.list`
follows continue tokens (every object once), and `ConfigClient.watch`, cut in its list phase by
a SIGKILL of the config process, resumes the list at its revision with the continue token of the
last ADDED rather than listing again.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from enmasse.cli.client import ConfigClient
from enmasse.config.store import Commit, Store
from enmasse.resources.kinds import KINDS, object_of, resource_of
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

SPACE = "shop"
Event = config_pb2.WatchEvent


def fill(target: str, count: int) -> None:
    """A space of `count` queues q0000... (and its DLQ), on a space plan without quotas."""
    with grpc.insecure_channel(target) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        stub.CreateAddressSpacePlan(
            resources_pb2.AddressSpacePlan(
                metadata={"name": "unlimited"},
                spec={"address_space_type": "standard", "address_plans": ["standard-small-queue"]},
            )
        )
        batch = [
            resource_of(
                resources_pb2.AddressSpace(
                    metadata={"name": SPACE}, spec={"type": "standard", "plan": "unlimited"}
                )
            ),
            *(queue(f"q{n:04}") for n in range(count)),
        ]
        request = config_pb2.ApplyRequest(space=SPACE, manager="cli", resources=batch)
        stub.Apply(request, timeout=120)


def queue(name: str) -> resources_pb2.Resource:
    spec = {"address": name, "type": "queue", "plan": "standard-small-queue"}
    return resource_of(resources_pb2.Address(metadata={"name": name, "space": SPACE}, spec=spec))


def seen_as(event: config_pb2.WatchEvent) -> tuple[str, str]:
    name = object_of(event.object).metadata.name if event.HasField("object") else ""
    return Event.Type.Name(event.type), name


async def delete_behind_configs_back(endpoint: str, prefix: str, names: list[str]) -> None:
    store = Store(endpoints=[endpoint], prefix=prefix)
    try:
        for name in names:
            commit = Commit(deletes=[("Address", SPACE, name)])
            assert await store.commit(commit, guard=await store.guard_revision())
    finally:
        await store.close()


def test_get_lists_every_page(etcd, etcd_prefix, config_process_factory) -> None:
    process = config_process_factory(etcd_endpoint=etcd.endpoint, prefix=etcd_prefix)
    fill(process.target, 1200)
    with ConfigClient(server=process.target) as client:
        names = [object_of(r).metadata.name for r in client.list(KINDS["Address"], space=SPACE)]
    assert len(names) == 1201, "1,200 queues and the DLQ, past the first page of 500"
    assert sorted(names) == sorted([f"q{n:04}" for n in range(1200)] + ["dlq"])


@pytest.mark.slow
def test_watch_cut_in_its_list_phase_resumes_the_list(
    etcd, etcd_prefix, config_process_factory
) -> None:
    process = config_process_factory(etcd_endpoint=etcd.endpoint, prefix=etcd_prefix)
    fill(process.target, 1500)
    seen: list[tuple[str, str]] = []
    with ConfigClient(server=process.target) as client:
        events = client.watch(kinds=["Address"], space=SPACE)
        for event in events:
            seen.append(seen_as(event))
            if len(seen) == 700:
                break  # the generator waits here, its stream open, while config goes
        process.kill()
        # while config is down: one object the cut list sent, one it had not reached
        asyncio.run(delete_behind_configs_back(etcd.endpoint, etcd_prefix, ["q0001", "q1400"]))
        process.start()
        with grpc.insecure_channel(process.target) as channel:  # the end of what to read
            config_pb2_grpc.ConfigServiceStub(channel).CreateAddress(
                object_of(queue("after")), timeout=30
            )
        for event in events:
            seen.append(seen_as(event))
            if seen[-1] == ("ADDED", "after"):
                break
        events.close()
    added = [name for kind, name in seen[:-1] if kind == "ADDED"]
    assert sorted(added) == sorted([f"q{n:04}" for n in range(1500)] + ["dlq"])
    # the list as it was at its revision, then the deletes as changes (a list started again
    # after them would end with a made-up DELETED q0001 before SYNCED and no q1400 at all)
    assert seen[-4:] == [
        ("SYNCED", ""),
        ("DELETED", "q0001"),
        ("DELETED", "q1400"),
        ("ADDED", "after"),
    ]
