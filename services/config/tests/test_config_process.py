"""`enmasse-config` as a real process: flags, port file, several etcd endpoints, honest health."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from enmasse.v1 import config_pb2, config_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

Health = health_pb2.HealthCheckResponse


async def health_becomes(channel: grpc.aio.Channel, wanted: int, *, within: float = 20.0) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + within
    while True:
        request = health_pb2.HealthCheckRequest(service="enmasse.v1.ConfigService")
        status = (await stub.Check(request, timeout=2)).status
        if status == wanted:
            return
        assert time.monotonic() < deadline, f"health stayed {Health.ServingStatus.Name(status)}"
        await asyncio.sleep(0.2)


async def test_port_file_several_endpoints_and_default_plans(
    etcd, etcd_prefix, config_process_factory
) -> None:
    # the same member twice is enough to exercise the multi-address target
    config = config_process_factory(
        etcd_endpoint=f"{etcd.endpoint},{etcd.endpoint}", prefix=etcd_prefix
    )
    assert config.port > 0
    async with grpc.aio.insecure_channel(config.target) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        plans = await stub.ListAddressSpacePlans(config_pb2.ListRequest(), timeout=5)
        assert sorted(p.metadata.name for p in plans.items) == [
            "brokered-single",
            "development",
            "standard-small",
        ]
        await health_becomes(channel, Health.SERVING)


@pytest.mark.slow
async def test_health_follows_etcd(fresh_etcd, etcd_prefix, config_process_factory) -> None:
    config = config_process_factory(etcd_endpoint=fresh_etcd.endpoint, prefix=etcd_prefix)
    async with grpc.aio.insecure_channel(config.target) as channel:
        await health_becomes(channel, Health.SERVING)
        fresh_etcd.kill()
        await health_becomes(channel, Health.NOT_SERVING)
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.ListAddresses(config_pb2.ListRequest(), timeout=5)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error.value.details().startswith("the store is unavailable: etcd: UNAVAILABLE")
        fresh_etcd.start()
        await health_becomes(channel, Health.SERVING)
        listed = await stub.ListAddressPlans(config_pb2.ListRequest(), timeout=5)
        assert len(listed.items) == 9, "what etcd held before the crash is still there"
