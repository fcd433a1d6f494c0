"""How a client of the config service says who it is: a bearer token in every call's metadata.

In: a token (the secret `enmasse token create` printed once, or what `enmasse up` wrote into a
file of mode 0600 for each control-plane service). Out: the call metadata
`authorization: Bearer <token>` (`bearer_metadata`, for blocking stubs: the CLI), and a grpc.aio
channel that adds it to every call made on it (`config_channel`: the informers and the
controllers' status writes), so no call site has to remember it.

Why a file is read on every call (cheaply: again only when it changed): `enmasse up` starts the
controllers and writes their tokens beside them, a token can be rotated by rewriting its file, and
a service must pick either up without a restart. Until the file exists the calls go without a
token and the config service answers UNAUTHENTICATED, which the callers already retry like any
other refusal of a service that is not ready yet.

Transport: given the caller's `TlsFiles` (its `--tls-dir`) a channel speaks TLS, trusts only
that CA and presents the caller's certificate (mutual TLS: the servers of `enmasse.common.serving`
require one); `peer_channel` is the same without a token, for RouterAdmin and BrokerAdmin, which
know their callers by certificate alone. Without TLS files a channel is plaintext, as before.
A caller whose token is all it holds (a tenant, the CLI) verifies the server against a CA file
and presents nothing (`verifying_credentials`): the config service asks no certificate of it.

Why an interceptor and not `grpc.metadata_call_credentials`: call credentials need a secure
channel, and without TLS files the channel is plain gRPC (tests, benches); one way for both.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from enmasse.common.certificates import TlsFiles

AUTHORIZATION = "authorization"
BEARER = "Bearer "
TOKEN_FILE_ENV = "ENMASSE_TOKEN_FILE"
"""Where a control-plane service finds its token file when no --token-file is given."""

TokenSource = Callable[[], str]
"""The token to send now ("" for none)."""


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries `token` (none for an empty one). Surrounding white space
    goes: a token read from a file or pasted ends in a newline, which no header may hold."""
    token = token.strip()
    return ((AUTHORIZATION, BEARER + token),) if token else ()


class TokenFile:
    """A token kept in a file: read again only when the file changed; "" while there is none."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._seen: tuple[int, int] | None = None
        self._token = ""

    def __call__(self) -> str:
        try:
            stat = self.path.stat()
        except OSError:
            self._seen, self._token = None, ""
            return ""
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen != self._seen:
            try:
                self._token = self.path.read_text().strip()
            except OSError:
                return ""
            self._seen = seen
        return self._token


def token_file_source(option: str | None) -> TokenSource | None:
    """The token file a service was given (--token-file, else $ENMASSE_TOKEN_FILE), or None."""
    path = option or os.environ.get(TOKEN_FILE_ENV)
    return TokenFile(path) if path else None


def _with_token(details: grpc.aio.ClientCallDetails, token: str) -> grpc.aio.ClientCallDetails:
    if not token:
        return details
    metadata = grpc.aio.Metadata(*(details.metadata or ()), *bearer_metadata(token))
    return grpc.aio.ClientCallDetails(
        method=details.method,
        timeout=details.timeout,
        metadata=metadata,
        credentials=details.credentials,
        wait_for_ready=details.wait_for_ready,
    )


class _UnaryBearer(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, token: TokenSource) -> None:
        self._token = token

    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return await continuation(_with_token(client_call_details, self._token()), request)


class _StreamBearer(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, token: TokenSource) -> None:
        self._token = token

    async def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return await continuation(_with_token(client_call_details, self._token()), request)


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    """TLS trusting only `tls`'s CA, presenting `tls`'s certificate (mutual TLS)."""
    chain, key, authority = tls.read()
    return grpc.ssl_channel_credentials(
        root_certificates=authority, private_key=key, certificate_chain=chain
    )


def verifying_credentials(ca_file: str | os.PathLike[str]) -> grpc.ChannelCredentials:
    """TLS trusting only the CA certificate(s) in `ca_file`, presenting no certificate: for a
    caller whose credential is its bearer token. OSError when the file cannot be read."""
    return grpc.ssl_channel_credentials(root_certificates=Path(ca_file).read_bytes())


def peer_channel(
    target: str,
    *,
    tls: TlsFiles | None,
    options: Sequence[tuple[str, Any]] = (),
    interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
) -> grpc.aio.Channel:
    """A grpc.aio channel: mutual TLS with `tls`, plaintext without."""
    if tls is None:
        return grpc.aio.insecure_channel(
            target, options=list(options), interceptors=list(interceptors)
        )
    return grpc.aio.secure_channel(
        target, channel_credentials(tls), options=list(options), interceptors=list(interceptors)
    )


def config_channel(
    target: str,
    *,
    token: TokenSource | None,
    options: Sequence[tuple[str, Any]] = (),
    tls: TlsFiles | None = None,
) -> grpc.aio.Channel:
    """A grpc.aio channel to the config service whose every call carries `token` (when given)."""
    interceptors: list[grpc.aio.ClientInterceptor] = (
        [_UnaryBearer(token), _StreamBearer(token)] if token is not None else []
    )
    return peer_channel(target, tls=tls, options=options, interceptors=interceptors)
