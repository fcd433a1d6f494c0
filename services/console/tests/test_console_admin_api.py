"""The console's client against a real config service (in process, over a real etcd): the
refusal of a bad address lands beside its field, as the API words it; the Watch of a space's
addresses becomes the page's server-sent events (synced, added, then removed)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import pytest
from enmasse.console.admin_api import AdminApi, Refusal, open_channel
from enmasse.console.forms import ADDRESS_FIELDS, AddressForm, field_errors
from enmasse.console.live import frame_of
from enmasse.resources.validation import address_problem
from enmasse.v1 import resources_pb2

from tests.fixtures.config_service import SPACE_QUEUES, InProcessConfig

NO_TOKEN = ""  # the in-process config service runs without --auth


@pytest.fixture
async def api(config_server: InProcessConfig) -> AsyncIterator[AdminApi]:
    api = AdminApi(open_channel(config_server.target, ca_file=None))
    await api.stub.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata={"name": "shop"}, spec={"type": "standard", "plan": "standard-small"}
        )
    )
    try:
        yield api
    finally:
        await api.close()


async def test_a_bad_address_is_refused_beside_its_field(api: AdminApi) -> None:
    form = AddressForm.from_fields(
        {"name": "bad", "address": "a..b", "type": "anycast", "plan": "standard-anycast"}
    )
    with pytest.raises(Refusal) as refused:
        await api.write_address(form.to_address(space="shop"), create=True, token=NO_TOKEN)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field_errors(refused.value.message, fields=ADDRESS_FIELDS) == {
        "address": address_problem("a..b")
    }
    listed = await api.addresses("shop", token=NO_TOKEN)
    assert [a.metadata.name for a in listed] == SPACE_QUEUES  # the space's own queues alone


def _frames(frames: list[str]) -> list[tuple[str, str]]:
    """(event, the address name or "") of each SSE frame."""
    out = []
    for frame in frames:
        event, data = (line.split(": ", 1)[1] for line in frame.strip().split("\n"))
        out.append((event, json.loads(data).get("name", "")))
    return out


async def test_the_watch_of_a_space_becomes_server_sent_events(api: AdminApi) -> None:
    frames: list[str] = []
    synced, added = asyncio.Event(), asyncio.Event()
    form = AddressForm.from_fields({"name": "calls", "type": "anycast", "plan": "standard-anycast"})

    async def follow() -> None:
        async for event in api.watch(kinds=["Address"], space="shop", token=NO_TOKEN):
            if (frame := frame_of(event)) is not None:
                frames.append(frame)
            if frames:
                synced.set()
            if ("address", "calls") in _frames(frames):
                added.set()
            if _frames(frames)[-1:] == [("removed", "calls")]:
                return

    async with asyncio.timeout(30), asyncio.TaskGroup() as group:
        group.create_task(follow())
        await synced.wait()
        await api.write_address(form.to_address(space="shop"), create=True, token=NO_TOKEN)
        await added.wait()
        await api.delete("Address", "shop", "calls", token=NO_TOKEN)
    events = _frames(frames)
    # the space's own queues (its DLQ and MQTT stores) are listed first, then "synced"
    own = [("address", name) for name in SPACE_QUEUES]
    assert events[: len(own) + 1] == [*own, ("synced", "")]
    assert events[-1] == ("removed", "calls")
    assert set(events[len(own) + 1 : -1]) == {("address", "calls")}  # added, then its status
