"""How a config client carries its token (`enmasse.common.credentials`): the metadata, the token
file read again when it changes, and a channel that adds the token to every call, unary and
streaming, checked against a real grpc.aio server that reports what it received."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from enmasse.common.credentials import (
    TOKEN_FILE_ENV,
    TokenFile,
    bearer_metadata,
    config_channel,
    token_file_source,
)


def test_the_metadata() -> None:
    assert bearer_metadata("abc") == (("authorization", "Bearer abc"),)
    assert bearer_metadata(" abc\n") == (("authorization", "Bearer abc"),)
    assert bearer_metadata("") == ()
    assert bearer_metadata("\n") == ()


def test_a_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "router-agent.token"
    token = TokenFile(path)
    assert token() == ""  # not there yet: calls go without one
    path.write_text("first\n")
    assert token() == "first"
    path.write_text("second-and-longer\n")
    assert token() == "second-and-longer"
    path.unlink()
    assert token() == ""


def test_the_token_file_comes_from_the_option_else_the_env(tmp_path: Path) -> None:
    previous = os.environ.pop(TOKEN_FILE_ENV, None)
    try:
        assert token_file_source(None) is None
        os.environ[TOKEN_FILE_ENV] = str(tmp_path / "env.token")
        from_env = token_file_source(None)
        assert isinstance(from_env, TokenFile)
        assert from_env.path == tmp_path / "env.token"
        from_option = token_file_source(str(tmp_path / "option.token"))
        assert isinstance(from_option, TokenFile)
        assert from_option.path == tmp_path / "option.token"
    finally:
        os.environ.pop(TOKEN_FILE_ENV, None)
        if previous is not None:
            os.environ[TOKEN_FILE_ENV] = previous


def _authorization(context: grpc.aio.ServicerContext) -> bytes:
    found = [v for k, v in context.invocation_metadata() or () if k == "authorization"]
    return str(found[0] if found else "-").encode()


async def _unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return _authorization(context)


async def _stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    yield _authorization(context)


async def test_every_call_on_a_config_channel_carries_the_token(tmp_path: Path) -> None:
    server = grpc.aio.server()
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(_unary),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("echo.Echo", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    path = tmp_path / "token"
    try:
        target = f"127.0.0.1:{port}"
        async with config_channel(target, token=TokenFile(path)) as channel:
            unary = channel.unary_unary("/echo.Echo/Unary")
            stream = channel.unary_stream("/echo.Echo/Stream")
            assert await unary(b"") == b"-"  # no file yet: no header at all
            path.write_text("s3cret\n")
            assert await unary(b"") == b"Bearer s3cret"
            assert [m async for m in stream(b"")] == [b"Bearer s3cret"]
            path.write_text("rotated\n")
            assert await unary(b"") == b"Bearer rotated"
            assert await unary(b"", metadata=(("x-other", "1"),)) == b"Bearer rotated"
        async with config_channel(target, token=None) as channel:
            assert await channel.unary_unary("/echo.Echo/Unary")(b"") == b"-"
    finally:
        await server.stop(0)
