"""The console's one way out: the config service's gRPC admin API, called with the user's token.

In: the config service's address, the CA certificate to verify it (None: plaintext, a config run
by hand without TLS), and on every call the token of the browser that asked (from its cookie).
Out: the API's own answers (resources, lists, a stream of watch events) and, when it refuses,
`Refusal`: the gRPC status code and the API's message, which the pages show as they are.

One grpc.aio channel for the whole console (opened in the ASGI lifespan, on the server's event
loop); the token goes in each call's metadata (`authorization: Bearer <token>`), so one channel
serves every user and the API alone decides what each may see and do: a tenant's list of
spaces holds its spaces because the API answers so. The console holds no token of its own and
presents no certificate: like the CLI, it is a client whose credential is the token.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from enmasse.common.credentials import bearer_metadata, verifying_credentials
from enmasse.resources.paging import every_item_async
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

CALL_TIMEOUT = 10.0

# UNAVAILABLE means the call was not answered: retried briefly by gRPC itself, as the CLI does.
_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "enmasse.v1.ConfigService"}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.2s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


@dataclass(frozen=True)
class Refusal(Exception):
    """The API said no (or did not answer): its status code and its message, for people."""

    code: grpc.StatusCode
    message: str

    def __str__(self) -> str:
        return self.message


def _refusal(error: grpc.aio.AioRpcError) -> Refusal:
    if error.code() == grpc.StatusCode.UNAVAILABLE:
        return Refusal(error.code(), "the config service does not answer; try again shortly")
    return Refusal(error.code(), error.details() or error.code().name)


def open_channel(target: str, *, ca_file: Path | None) -> grpc.aio.Channel:
    options = [("grpc.enable_retries", 1), ("grpc.service_config", _SERVICE_CONFIG)]
    if ca_file is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, verifying_credentials(ca_file), options=options)


class AdminApi:
    """The ConfigService calls the console makes, each with the caller's token."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.stub = config_pb2_grpc.ConfigServiceStub(channel)

    async def close(self) -> None:
        await self.channel.close()

    async def _call(self, method: str, request: object, *, token: str) -> object:
        try:
            return await getattr(self.stub, method)(
                request, metadata=bearer_metadata(token), timeout=CALL_TIMEOUT
            )
        except grpc.aio.AioRpcError as error:
            raise _refusal(error) from None

    async def _list(self, method: str, request: config_pb2.ListRequest, *, token: str) -> list[Any]:
        """Every page of a List (`enmasse.resources.paging`)."""

        async def page(request: config_pb2.ListRequest) -> Any:
            return await self._call(method, request, token=token)

        return await every_item_async(page, request)

    async def address_spaces(self, *, token: str) -> Sequence[resources_pb2.AddressSpace]:
        return await self._list("ListAddressSpaces", config_pb2.ListRequest(), token=token)

    async def address_space(self, space: str, *, token: str) -> resources_pb2.AddressSpace:
        reply = await self._call("GetAddressSpace", config_pb2.ObjectRef(name=space), token=token)
        assert isinstance(reply, resources_pb2.AddressSpace)
        return reply

    async def address_space_plan(self, name: str, *, token: str) -> resources_pb2.AddressSpacePlan:
        ref = config_pb2.ObjectRef(name=name)
        reply = await self._call("GetAddressSpacePlan", ref, token=token)
        assert isinstance(reply, resources_pb2.AddressSpacePlan)
        return reply

    async def address_plans(self, *, token: str) -> Sequence[resources_pb2.AddressPlan]:
        return await self._list("ListAddressPlans", config_pb2.ListRequest(), token=token)

    async def addresses(self, space: str, *, token: str) -> Sequence[resources_pb2.Address]:
        return await self._list("ListAddresses", config_pb2.ListRequest(space=space), token=token)

    async def address(self, space: str, name: str, *, token: str) -> resources_pb2.Address:
        ref = config_pb2.ObjectRef(space=space, name=name)
        reply = await self._call("GetAddress", ref, token=token)
        assert isinstance(reply, resources_pb2.Address)
        return reply

    async def write_address(
        self, address: resources_pb2.Address, *, create: bool, token: str
    ) -> resources_pb2.Address:
        method = "CreateAddress" if create else "UpdateAddress"
        reply = await self._call(method, address, token=token)
        assert isinstance(reply, resources_pb2.Address)
        return reply

    async def delete(self, kind: str, space: str, name: str, *, token: str) -> None:
        """Deletes an `Address` or a `MessagingUser` (whatever version is there)."""
        request = config_pb2.DeleteRequest(ref=config_pb2.ObjectRef(space=space, name=name))
        await self._call(f"Delete{kind}", request, token=token)

    async def users(self, space: str, *, token: str) -> Sequence[resources_pb2.MessagingUser]:
        request = config_pb2.ListRequest(space=space)
        return await self._list("ListMessagingUsers", request, token=token)

    async def user(self, space: str, name: str, *, token: str) -> resources_pb2.MessagingUser:
        ref = config_pb2.ObjectRef(space=space, name=name)
        reply = await self._call("GetMessagingUser", ref, token=token)
        assert isinstance(reply, resources_pb2.MessagingUser)
        return reply

    async def write_user(
        self, user: resources_pb2.MessagingUser, *, create: bool, token: str
    ) -> resources_pb2.MessagingUser:
        method = "CreateMessagingUser" if create else "UpdateMessagingUser"
        reply = await self._call(method, user, token=token)
        assert isinstance(reply, resources_pb2.MessagingUser)
        return reply

    async def may_write(self, space: str, *, token: str) -> None:
        """Whether the token may write in the space (a write the console makes elsewhere, the
        Close of a connection): the API's answer to an Apply of nothing there, a dry run, which
        it authorizes (and audits) as any Apply in the space and which writes nothing. Returns
        when it may; a viewer's token, or another space's, gets the API's `Refusal`."""
        request = config_pb2.ApplyRequest(space=space, manager="console", dry_run=True)
        await self._call("Apply", request, token=token)

    async def watch(
        self, *, kinds: Sequence[str], space: str, token: str
    ) -> AsyncIterator[config_pb2.WatchEvent]:
        """Watch from the start (ADDED per object, SYNCED, then changes) until the caller stops
        iterating (the browser went away) or the API ends the stream (`Refusal`)."""
        request = config_pb2.WatchRequest(kinds=list(kinds), space=space)
        call = self.stub.Watch(request, metadata=bearer_metadata(token))
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as error:
            raise _refusal(error) from None
        finally:
            call.cancel()
