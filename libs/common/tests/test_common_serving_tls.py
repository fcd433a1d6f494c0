"""gRPC with mutual TLS (enmasse.common.serving + enmasse.common.credentials) on loopback.

A plaintext client gets no call through, nor one whose certificate another CA signed; a client
of the CA does, and `caller_roles` lets only the named roles reach a servicer (health stays open).
A port that requires no client certificate (the config service's) stays TLS-only and lets in a
client that verifies it and presents nothing (`verifying_credentials`).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from enmasse.common.certificates import (
    CONTROL_PLANE,
    Holder,
    TlsFiles,
    ensure_authority,
    ensure_certificate,
)
from enmasse.common.credentials import peer_channel, verifying_credentials
from enmasse.common.serving import RunningServer, start_server
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVICE = "test.Echo"
SAY = f"/{SERVICE}/Say"


async def _say(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return b"heard " + request


def _add_echo(servicer: object, server: grpc.aio.Server) -> None:
    handlers = {"Say": grpc.unary_unary_rpc_method_handler(_say)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


def _files(tmp_path: Path, *, ca: str, name: str, role: str) -> TlsFiles:
    authority = ensure_authority(tmp_path / ca, name=ca)
    return ensure_certificate(
        tmp_path / ca / name, Holder(name=name, role=role), authority=authority
    )


async def _serve(tls: TlsFiles, *, roles: tuple[str, ...] = ()) -> RunningServer:
    return await start_server(
        registrations=[(_add_echo, object(), SERVICE)], tls=tls, caller_roles=roles
    )


async def _say_over(channel: grpc.aio.Channel) -> bytes:
    say = channel.unary_unary(SAY)
    answer: bytes = await say(b"hello", timeout=5)
    return answer


async def test_mutual_tls_lets_in_only_clients_of_the_authority(tmp_path: Path) -> None:
    server_files = _files(tmp_path, ca="ours", name="server", role="data-plane")
    running = await _serve(server_files)
    target = f"127.0.0.1:{running.port}"
    try:
        async with peer_channel(
            target, tls=_files(tmp_path, ca="ours", name="client", role=CONTROL_PLANE)
        ) as channel:
            assert await _say_over(channel) == b"heard hello"
        async with grpc.aio.insecure_channel(target) as plaintext:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _say_over(plaintext)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        stranger = _files(tmp_path, ca="theirs", name="client", role=CONTROL_PLANE)
        # The stranger trusts our server's CA (so only the server's check of the client is tested).
        stranger.ca.write_bytes(server_files.ca.read_bytes())
        async with peer_channel(target, tls=stranger) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _say_over(channel)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await running.stop(grace=0)


async def test_caller_roles_admit_only_the_named_roles(tmp_path: Path) -> None:
    running = await _serve(
        _files(tmp_path, ca="ours", name="server", role="data-plane"), roles=(CONTROL_PLANE,)
    )
    target = f"127.0.0.1:{running.port}"
    try:
        agent = _files(tmp_path, ca="ours", name="agent", role=CONTROL_PLANE)
        async with peer_channel(target, tls=agent) as channel:
            assert await _say_over(channel) == b"heard hello"
        other = _files(tmp_path, ca="ours", name="router", role="data-plane")
        async with peer_channel(target, tls=other) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _say_over(channel)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            probe = health_pb2_grpc.HealthStub(channel)
            answer = await probe.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await running.stop(grace=0)


async def test_a_port_that_requires_no_certificate_is_still_tls_only(tmp_path: Path) -> None:
    server_files = _files(tmp_path, ca="ours", name="server", role=CONTROL_PLANE)
    running = await start_server(
        registrations=[(_add_echo, object(), SERVICE)],
        tls=server_files,
        require_client_certificate=False,
    )
    target = f"127.0.0.1:{running.port}"
    try:
        verified = verifying_credentials(server_files.ca)
        async with grpc.aio.secure_channel(target, verified) as channel:
            assert await _say_over(channel) == b"heard hello"
        async with grpc.aio.insecure_channel(target) as plaintext:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _say_over(plaintext)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        stranger = _files(tmp_path, ca="theirs", name="client", role=CONTROL_PLANE)
        trusting_another = verifying_credentials(stranger.ca)  # the client checks the server
        async with grpc.aio.secure_channel(target, trusting_another) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _say_over(channel)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await running.stop(grace=0)
