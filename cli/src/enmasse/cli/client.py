"""The CLI's side of the ConfigService: where it is, how to call it, and what its errors mean.

Where: `--server host:port`, else $ENMASSE_SERVER, else the address `enmasse up` wrote to
<var>/run/config.addr, else DEFAULT_SERVER (127.0.0.1:5680, the port to give `enmasse-config
--listen` when running it by hand).

Who: `--token`, else $ENMASSE_TOKEN, else the admin token `enmasse up` wrote to
<var>/run/admin-token (`resolve_token`), sent as `authorization: Bearer <token>` on every call;
none at all when there is none (a config service run without --auth takes calls without one).

Transport: TLS verifying the config service against a CA file, presenting no certificate: the
token is the credential, so a tenant with a token and the CA's certificate connects as the admin
does. The CA file is `--ca-file`, else $ENMASSE_CA_FILE, else <var>/tls/ca.crt, which `enmasse up`
publishes (`resolve_ca_file`); with none the channel is plaintext (a config run by hand without
--tls-dir). `open_channel` opens it.

The machine operator's certificate, <var>/tls/operator (role `operator`, key mode 0600), is not
for config at all: it is what `up`'s readiness wait and `status` show RouterAdmin, BrokerAdmin
and the router-agent, which know callers by certificate alone and let this one read, never
change (`operator_tls`, `open_operator_channel`).

How: a blocking gRPC channel per command (a CLI does one thing and exits), a deadline on every
unary call (`--timeout`, default 10 s), and Watch as a stream that resumes from the last revision it
saw when the connection drops.

Errors: every grpc.RpcError becomes a `CliError` whose text is what the user reads: the server's
own message for refusals (INVALID_ARGUMENT, FAILED_PRECONDITION, NOT_FOUND, ALREADY_EXISTS,
PERMISSION_DENIED), a hint for ABORTED (stale resource_version) and UNAUTHENTICATED (where a token
comes from) and, when nothing answers, the question everyone asks first: is `enmasse up` running?
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import grpc
from enmasse.common.certificates import CA_FILE, TlsFiles
from enmasse.common.credentials import bearer_metadata, channel_credentials, verifying_credentials
from enmasse.resources.kinds import Key, Kind, key_of, resource_of
from enmasse.resources.paging import every_item
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

DEFAULT_SERVER = "127.0.0.1:5680"
DEFAULT_TIMEOUT = 10.0
TOKEN_ENV = "ENMASSE_TOKEN"
CA_FILE_ENV = "ENMASSE_CA_FILE"


# A connection that fails to open (a busy machine can time a TLS handshake out) is tried again
# by gRPC's own retry policy, a few times within about 2 s, before the CLI says "cannot reach":
# UNAVAILABLE means the call was not answered, and the config service's writes are compare-and-
# swap or create-if-absent, so a retried write cannot apply twice.
_RETRY_UNAVAILABLE = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "enmasse.v1.ConfigService"}],
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.25s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)

_RECONNECT_FAST = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 1),
    ("grpc.service_config", _RETRY_UNAVAILABLE),
]


class CliError(click.ClickException):
    """A failure the user must read: printed as `error: <message>`, exit code 1, no traceback."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class Unreachable(CliError):
    """The config service did not answer (UNAVAILABLE): down, or a connection that broke. Who
    waits for something anyway (`up` waiting until addresses are ready) asks again."""


class NotFound(CliError):
    """The config service has no such object (NOT_FOUND): `wait --for=delete` waits for this."""


def resolve_server(*, option: str | None, var_dir: Path) -> str:
    if option:
        return option
    if env := os.environ.get("ENMASSE_SERVER"):
        return env
    addr_file = var_dir / "run" / "config.addr"
    try:
        if text := addr_file.read_text().strip():
            return text
    except OSError:
        pass
    return DEFAULT_SERVER


def admin_token_file(var_dir: Path) -> Path:
    """Where `enmasse up` keeps the admin token of its config service (mode 0600)."""
    return var_dir / "run" / "admin-token"


def tls_root(var_dir: Path) -> Path:
    """Where `enmasse up` keeps its CAs and one certificate directory per holder (mode 0700)."""
    return var_dir / "tls"


def trusted_ca_file(var_dir: Path) -> Path:
    """The CA certificate `enmasse up` publishes for clients: the one that signed the config
    service's certificate and every client endpoint's (amqps). Nothing secret."""
    return tls_root(var_dir) / CA_FILE


def resolve_ca_file(*, option: str | None, var_dir: Path) -> Path | None:
    """The CA to verify the config service (and amqps endpoints) against: --ca-file, else
    $ENMASSE_CA_FILE, else `trusted_ca_file` when `enmasse up` made it; None: plaintext."""
    if option:
        return Path(option)
    if env := os.environ.get(CA_FILE_ENV):
        return Path(env)
    return local_ca_file(var_dir)


def local_ca_file(var_dir: Path) -> Path | None:
    """`trusted_ca_file` once `enmasse up` made it in `var_dir`, else None."""
    published = trusted_ca_file(var_dir)
    return published if published.is_file() else None


OPERATOR_HOLDER = "operator"
"""The machine operator's certificate: RouterAdmin and BrokerAdmin let it read, never change."""


def operator_tls(var_dir: Path) -> TlsFiles | None:
    """The operator's certificate when `enmasse up` made one in `var_dir`, else None."""
    files = TlsFiles(tls_root(var_dir) / OPERATOR_HOLDER)
    return files if files.exist() else None


def open_channel(
    target: str, *, ca_file: Path | None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    """A blocking channel to the config service: TLS verifying it against `ca_file` and
    presenting no certificate (the calls' token says who calls); plaintext without a CA file."""
    if ca_file is None:
        return grpc.insecure_channel(target, options=list(options))
    try:
        credentials = verifying_credentials(ca_file)
    except OSError as error:
        raise CliError(f"cannot read the CA file {ca_file}: {error.strerror or error}") from None
    return grpc.secure_channel(target, credentials, options=list(options))


def open_operator_channel(
    target: str, *, tls: TlsFiles | None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    """A blocking channel to RouterAdmin, BrokerAdmin or the router-agent: mutual TLS with the
    operator's certificate, plaintext without."""
    if tls is None:
        return grpc.insecure_channel(target, options=list(options))
    return grpc.secure_channel(target, channel_credentials(tls), options=list(options))


def resolve_token(*, option: str | None, var_dir: Path) -> str:
    """The token to call with: --token, else $ENMASSE_TOKEN, else `enmasse up`'s admin token;
    "" when there is none."""
    if option:
        return option
    if env := os.environ.get(TOKEN_ENV):
        return env
    try:
        return admin_token_file(var_dir).read_text().strip()
    except OSError:
        return ""


class ListPhase:
    """The events of a watch's list phase (ADDED for what exists, then SYNCED), across streams.

    A stream that drops before SYNCED leaves the list incomplete, with no revision to resume
    from: the watch lists again. What the cut list already passed on is not passed on twice:
    an object listed again unchanged is skipped, a changed one comes as MODIFIED, and at SYNCED
    whatever the earlier list passed on and this one does not hold comes as DELETED.
    """

    def __init__(self) -> None:
        self._passed: dict[Key, resources_pb2.Resource] = {}
        self._listed: set[Key] = set()

    def restart(self) -> None:
        """A new stream begins its list."""
        self._listed = set()

    def passed_on(self, event: config_pb2.WatchEvent) -> list[config_pb2.WatchEvent]:
        Event = config_pb2.WatchEvent
        if event.type == Event.ADDED:
            key = key_of(event.object)
            self._listed.add(key)
            before = self._passed.get(key)
            self._passed[key] = event.object
            if before is None:
                return [event]
            if before == event.object:
                return []
            return [Event(type=Event.MODIFIED, object=event.object)]
        if event.type == Event.SYNCED:
            gone = [
                Event(type=Event.DELETED, object=obj, revision=event.revision)
                for key, obj in self._passed.items()
                if key not in self._listed
            ]
            return [*gone, event]
        return [event]


def _expired(error: grpc.RpcError) -> bool:
    code = error.code() if isinstance(error, grpc.Call) else None
    return code == grpc.StatusCode.OUT_OF_RANGE


def dropped(error: grpc.RpcError) -> bool:
    """Whether a call failed because the connection went (a stream worth resuming), not because
    the server said no. A server killed mid-stream is mostly UNAVAILABLE, but gRPC sometimes
    reports it as UNKNOWN "Stream removed" (grpc/grpc#34076)."""
    code = error.code()  # type: ignore[attr-defined]
    if code == grpc.StatusCode.UNAVAILABLE:
        return True
    return code == grpc.StatusCode.UNKNOWN and error.details() == "Stream removed"  # type: ignore[attr-defined]


def explain(error: grpc.RpcError, *, server: str) -> CliError:
    code = error.code()  # type: ignore[attr-defined]
    details = error.details() or ""  # type: ignore[attr-defined]
    if code == grpc.StatusCode.UNAVAILABLE:
        return Unreachable(f"cannot reach the config service at {server}: is `enmasse up` running?")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CliError(f"the config service at {server} did not answer in time ({details})")
    if code == grpc.StatusCode.ABORTED:
        return CliError(f"{details} (it changed since it was read: get it again and retry)")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return CliError(
            f"{details} (give --token TOKEN or set ${TOKEN_ENV}; `enmasse up` keeps its admin "
            "token in <var-dir>/run/admin-token)"
        )
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(details or code.name)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return CliError(f"the config service at {server} does not implement this call: {details}")
    return CliError(details or code.name)


@dataclass(frozen=True)
class _KindCalls:
    get: str
    list: str
    delete: str


def _calls(info: Kind) -> _KindCalls:
    plural = {"Address": "Addresses"}.get(info.name, info.name + "s")
    return _KindCalls(get=f"Get{info.name}", list=f"List{plural}", delete=f"Delete{info.name}")


class ConfigClient:
    """Thin, blocking, deadline-bound calls to one ConfigService."""

    def __init__(
        self,
        *,
        server: str,
        timeout: float = DEFAULT_TIMEOUT,
        token: str = "",
        ca_file: Path | None = None,
        wait_for_ready: bool = False,
    ) -> None:
        self.server = server
        self.timeout = timeout
        # `up` talks to a config service it has just (re)started: a call then waits, within its
        # deadline, for the connection instead of failing at once with UNAVAILABLE.
        self._wait_for_ready = wait_for_ready
        self._metadata = bearer_metadata(token)
        # A restarted config service must be found again within a second: gRPC's default
        # reconnect back-off grows to minutes, longer than `watch` waits for it.
        self._channel = open_channel(server, ca_file=ca_file, options=_RECONNECT_FAST)
        self._stub = config_pb2_grpc.ConfigServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ConfigClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any) -> Any:
        rpc: Callable[..., Any] = getattr(self._stub, method)
        try:
            return rpc(
                request,
                timeout=self.timeout,
                metadata=self._metadata,
                wait_for_ready=self._wait_for_ready,
            )
        except grpc.RpcError as error:
            raise explain(error, server=self.server) from None

    def list(self, info: Kind, *, space: str = "") -> list[resources_pb2.Resource]:
        def page(request: config_pb2.ListRequest) -> Any:
            return self._call(_calls(info).list, request)

        items = every_item(page, config_pb2.ListRequest(space=space))
        return [resource_of(item) for item in items]

    def get(self, info: Kind, *, name: str, space: str = "") -> resources_pb2.Resource:
        return resource_of(
            self._call(_calls(info).get, config_pb2.ObjectRef(space=space, name=name))
        )

    def delete(self, info: Kind, *, name: str, space: str = "", resource_version: int = 0) -> int:
        request = config_pb2.DeleteRequest(
            ref=config_pb2.ObjectRef(space=space, name=name), resource_version=resource_version
        )
        return int(self._call(_calls(info).delete, request).revision)

    def apply(
        self,
        *,
        space: str,
        resources: Sequence[resources_pb2.Resource],
        manager: str = "cli",
        prune: bool = False,
        dry_run: bool = False,
        atomic: bool = True,
    ) -> config_pb2.ApplyResponse:
        request = config_pb2.ApplyRequest(
            space=space,
            manager=manager,
            resources=list(resources),
            prune=prune,
            dry_run=dry_run,
            atomic=atomic,
        )
        reply: config_pb2.ApplyResponse = self._call("Apply", request)
        return reply

    # ------------------------------------------------------------ access tokens (admin)

    def create_token(
        self,
        *,
        name: str,
        role: str,
        spaces: Sequence[str] = (),
        expires_in: int = 0,
        replace: bool = False,
    ) -> config_pb2.CreateTokenResponse:
        request = config_pb2.CreateTokenRequest(
            name=name,
            role=role,
            spaces=list(spaces),
            expires_in_seconds=expires_in,
            replace=replace,
        )
        reply: config_pb2.CreateTokenResponse = self._call("CreateToken", request)
        return reply

    def list_tokens(self) -> Sequence[config_pb2.Token]:
        reply: config_pb2.TokenList = self._call("ListTokens", config_pb2.ListTokensRequest())
        return reply.items

    def revoke_token(self, name: str) -> config_pb2.Token:
        request = config_pb2.RevokeTokenRequest(name=name)
        token: config_pb2.Token = self._call("RevokeToken", request)
        return token

    def watch(
        self,
        *,
        kinds: Sequence[str],
        space: str = "",
        retry_for: float = 30.0,
    ) -> Iterator[config_pb2.WatchEvent]:
        """List-then-watch; on a dropped stream, resume after the last revision seen (no event
        missed or repeated), giving up when the server stays away for `retry_for` seconds. A
        stream dropped before the list was complete resumes the list with the continue token of
        the last ADDED; only when that token has expired does it list again (see `ListPhase`)."""
        revision = 0  # until SYNCED, a resume must go on with the list: it may be incomplete
        listing: ListPhase | None = ListPhase()
        resume = ""  # the list phase's continue token: where a cut list goes on
        down_since: float | None = None
        while True:
            request = config_pb2.WatchRequest(
                kinds=list(kinds), space=space, resource_version=revision, continue_token=resume
            )
            stream = self._stub.Watch(request, metadata=self._metadata)
            if listing is not None and not resume:
                listing.restart()
            try:
                for event in stream:
                    down_since = None
                    if listing is None:
                        if event.revision:
                            revision = max(revision, event.revision)
                        yield event
                        continue
                    yield from listing.passed_on(event)
                    resume = event.continue_token or resume
                    if event.type == config_pb2.WatchEvent.SYNCED:
                        listing, revision, resume = None, event.revision, ""
                return  # the server ended the stream on purpose
            except grpc.RpcError as error:
                if listing is not None and resume and _expired(error):
                    resume = ""  # the list's revision was compacted: list it all again
                    continue
                if not dropped(error):
                    raise explain(error, server=self.server) from None
                down_since = down_since or time.monotonic()
                if time.monotonic() - down_since > retry_for:
                    raise explain(error, server=self.server) from None
                time.sleep(0.5)
            finally:
                stream.cancel()
