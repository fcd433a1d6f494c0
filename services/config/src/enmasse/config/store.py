"""The etcd address store: keys, lists, guarded transactions, raw watch streams.

Key schema (every key under one prefix, `/enmasse/v1` unless `--prefix` says otherwise, so that
tests and several installations can share one etcd):

    <prefix>/resources/AddressSpacePlan/<name>        cluster-scoped kinds: plans ...
    <prefix>/resources/AddressPlan/<name>
    <prefix>/resources/AddressSpace/<name>            ... and address spaces (the name is the space)
    <prefix>/resources/Address/<space>/<name>         space-scoped kinds
    <prefix>/resources/MessagingUser/<space>/<name>
    <prefix>/guard                                    written by every write transaction
    <prefix>/tokens/<sha256 of the secret>            an access token's record (`config_pb2.Token`)
    <prefix>/token-names/<name>                       -> the sha256 of that name's token

Values are the serialized protobuf message of the kind (an `Address`, ...), stored with
`resource_version` 0: the key's mod revision is the resource version, read back on every get, so the
two can never disagree.

Why a guard key and no per-address index: every write checks its rules (address-string
uniqueness, quotas, "the topic exists", ...) in Python against a catalog that has seen every
change up to the guard's mod revision G (`enmasse.config.cache`), and commits in ONE transaction
that compares the guard with G and bumps it. If anybody wrote in between (another config
instance), the commit fails and the write is checked again. So every rule holds on a consistent
state, whatever the rule, without an index key per rule. The price is that writes are
serialized, which the config service does in-process anyway.

Two writes may take several transactions: a batch of status writes (`commit_puts`) and a large
Apply (`parts`, `commit_part`). Thousands of addresses do not fit in one under etcd's default
limits (128 operations, 1.5 MiB a request), so they go in as many as needed, each comparing the
guard with the revision the one before left it at. A commit that fits in one is one, as before.

Access tokens live beside the resources, outside `resources/` (so no Watch, List or catalog ever
sees them): found by the hash of the secret a caller presents, and by name for the admin's
list, replace and revoke. Only the hash is stored (`enmasse.config.tokens` says why sha256).

Watch streams are etcd's own (raw `Watch` over the resources prefix with `prev_kv`), so a resume
from revision N gets exactly the changes after N, or `Compacted` when etcd has dropped them.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog
from aetcd import rpc
from enmasse.common.certificates import TlsFiles
from enmasse.common.credentials import peer_channel
from enmasse.resources.kinds import KINDS, SPACE_SCOPED_KINDS, AnyObject, Key
from enmasse.v1 import config_pb2

log = structlog.get_logger(__name__)
DEFAULT_PREFIX = "/enmasse/v1"
ETCD_MAX_TXN_OPS = 128
"""etcd's default --max-txn-ops: the most operations in a transaction of `commit_puts`."""
ETCD_MAX_REQUEST_BYTES = 1536 * 1024
"""etcd's default --max-request-bytes: a transaction of `commit_puts` is smaller than this."""
_TXN_SLACK_BYTES = 4096  # the compare, the guard's put and the framing, with room to spare
_OP_OVERHEAD_BYTES = 16  # the framing of one put: tags and lengths
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # etcd restarts must be noticed within a second, not after grpc's default two-minute back-off.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class Compacted(Exception):
    """The revision a watch (or a paged read) asked for is older than etcd's compaction point
    (`compact_revision` 0: etcd did not say where that point is)."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"compacted up to revision {compact_revision}")
        self.compact_revision = compact_revision


class StoreUnavailable(Exception):
    """etcd cannot be reached, or did not answer in time: retry later."""


class StoreRefused(Exception):
    """etcd refused the request itself (a transaction with more operations than its
    --max-txn-ops, a request larger than its --max-request-bytes): retrying will not help."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


_REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
}


@dataclass
class Change:
    """One key change from etcd's watch, decoded: `obj` is the new value (or the last, deleted)."""

    type: str  # "put" or "delete"
    key: Key
    obj: AnyObject
    revision: int
    created: bool


@dataclass
class WatchBatch:
    """One etcd watch response: its changes, or none at all for a progress notification."""

    changes: list[Change] = field(default_factory=list)
    progress_revision: int = 0
    revision: int = 0  # the highest revision this response speaks of (every key, guard included)


@dataclass
class Page:
    """One read of a key range at one revision: (key below `resources/`, object) in key order,
    the revision read at, whether the range holds more after the last key, and that last key
    (the next page starts after it, even when it is not an object of ours)."""

    objects: list[tuple[str, AnyObject]]
    revision: int
    more: bool
    last: str


@dataclass
class Part:
    """One transaction of a commit too large for one: its operations and the keys it writes
    (an emptied space counts as its AddressSpace's key)."""

    ops: list[Any]
    keys: list[Key]


class TooLarge(Exception):
    """One object is larger than etcd takes in a request: no split can write it."""

    def __init__(self, key: Key, size: int, limit: int) -> None:
        super().__init__(
            f"{key[0]} {key[1]}/{key[2]}: {size} bytes, more than etcd takes ({limit})"
        )
        self.key = key


@dataclass
class Commit:
    """The writes of one transaction (or of several, `Store.parts`): objects to put, keys to
    delete, spaces to empty."""

    puts: dict[Key, AnyObject] = field(default_factory=dict)
    deletes: list[Key] = field(default_factory=list)
    emptied_spaces: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.puts or self.deletes or self.emptied_spaces)


class Store:
    """The address store over one etcd cluster (a gRPC channel to its endpoints)."""

    def __init__(
        self,
        *,
        endpoints: Sequence[str],
        prefix: str = DEFAULT_PREFIX,
        timeout: float = 10.0,
        tls: TlsFiles | None = None,
        max_txn_ops: int = ETCD_MAX_TXN_OPS,
        max_request_bytes: int = ETCD_MAX_REQUEST_BYTES,
    ) -> None:
        """`tls`: config's etcd client certificate and etcd's own CA (etcd runs with
        --client-cert-auth, and only config holds a certificate of that CA); None: plaintext.
        `max_txn_ops`, `max_request_bytes`: the limits `commit_puts` splits a batch by (etcd's
        defaults, which any etcd allows at least)."""
        self.prefix = prefix.rstrip("/")
        self._resources = f"{self.prefix}/resources/".encode()
        self._guard = f"{self.prefix}/guard".encode()
        self._tokens = f"{self.prefix}/tokens/".encode()
        self._token_names = f"{self.prefix}/token-names/".encode()
        self._timeout = timeout
        self._max_txn_ops = max_txn_ops
        self._max_request_bytes = max_request_bytes
        target = channel_target(endpoints)
        self._channel = peer_channel(target, tls=tls, options=_CHANNEL_OPTIONS)
        self._kv = rpc.KVStub(self._channel)
        self._watch = rpc.WatchStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    # ---------------------------------------------------------------- keys

    def key(self, key: Key) -> bytes:
        kind, space, name = key
        if kind in SPACE_SCOPED_KINDS:
            return self._resources + f"{kind}/{space}/{name}".encode()
        return self._resources + f"{kind}/{name}".encode()

    def parse_key(self, raw: bytes) -> Key | None:
        if not raw.startswith(self._resources):
            return None
        parts = raw[len(self._resources) :].decode().split("/")
        if parts[0] not in KINDS:
            return None  # not ours: skip it rather than fail a whole list
        if len(parts) == 3 and parts[0] in SPACE_SCOPED_KINDS:
            return parts[0], parts[1], parts[2]
        if len(parts) == 2 and parts[0] not in SPACE_SCOPED_KINDS:
            return parts[0], "", parts[1]
        return None

    def _decode(self, key: Key, value: bytes, mod_revision: int) -> AnyObject:
        obj: AnyObject = KINDS[key[0]].message()
        obj.ParseFromString(value)
        obj.metadata.resource_version = mod_revision
        return obj

    # ---------------------------------------------------------------- reads

    async def page(
        self, *, kind: str | None, space: str = "", after: str = "", revision: int, limit: int
    ) -> Page:
        """At most `limit` objects of one kind (None: every kind), of one `space` if given,
        whose keys sort after `after` (a key below `resources/`, as a Page names it; "": from
        the first), read at `revision` (0: now). Raises Compacted when etcd has compacted
        `revision` away."""
        start, end = self._range_of(kind, space)
        if after:
            start = max(start, self._resources + after.encode() + b"\0")
        request = rpc.RangeRequest(key=start, range_end=end, revision=revision, limit=limit)
        try:
            response = await self._call(self._kv.Range, request)
        except StoreRefused as error:
            if error.code == grpc.StatusCode.OUT_OF_RANGE and "compacted" in error.details:
                raise Compacted(0) from error
            raise
        out = []
        last = after
        for kv in response.kvs:
            last = kv.key[len(self._resources) :].decode()
            key = self.parse_key(kv.key)
            if key is not None:
                out.append((last, self._decode(key, kv.value, kv.mod_revision)))
        read_at = revision or int(response.header.revision)
        return Page(objects=out, revision=read_at, more=bool(response.more), last=last)

    async def get(self, key: Key) -> AnyObject | None:
        response = await self._call(self._kv.Range, rpc.RangeRequest(key=self.key(key)))
        if not response.kvs:
            return None
        kv = response.kvs[0]
        return self._decode(key, kv.value, kv.mod_revision)

    async def count(self, kind: str) -> int:
        start, end = self._range_of(kind)
        request = rpc.RangeRequest(key=start, range_end=end, count_only=True)
        return int((await self._call(self._kv.Range, request)).count)

    def _range_of(self, kind: str | None, space: str = "") -> tuple[bytes, bytes]:
        prefix = self._resources
        if kind is not None:
            prefix += f"{kind}/".encode()
            if space and kind in SPACE_SCOPED_KINDS:
                prefix += f"{space}/".encode()
        return prefix, _prefix_end(prefix)

    # ---------------------------------------------------------------- writes

    async def commit(self, commit: Commit, *, guard: int) -> int | None:
        """Writes everything in ONE transaction if the guard is still at `guard`.

        Returns the new store revision (every written key's mod revision), or None when somebody
        wrote in between: the caller re-reads and re-checks.
        """
        ops = []
        for key, obj in commit.puts.items():
            value = _stored_form(obj)
            ops.append(rpc.RequestOp(request_put=rpc.PutRequest(key=self.key(key), value=value)))
        for key in commit.deletes:
            ops.append(
                rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=self.key(key)))
            )
        for space in commit.emptied_spaces:
            for kind in SPACE_SCOPED_KINDS:
                start, end = self._range_of(kind, space)
                request = rpc.DeleteRangeRequest(key=start, range_end=end)
                ops.append(rpc.RequestOp(request_delete_range=request))
        return await self._guarded(ops, guard=guard)

    async def commit_puts(self, puts: Sequence[tuple[Key, AnyObject]], *, guard: int) -> list[int]:
        """Writes `puts` in order, in as few transactions as etcd's limits allow, each comparing
        the guard with the revision the one before left it at (the first: `guard`).

        Returns the revision each put was written at, for the puts written: all of them, or the
        first ones only when somebody else wrote in between (the caller re-reads, re-checks the
        rest and goes on).
        """
        revisions: list[int] = []
        for chunk in self._transactions([(self.key(key), _stored_form(obj)) for key, obj in puts]):
            ops = [rpc.RequestOp(request_put=rpc.PutRequest(key=k, value=v)) for k, v in chunk]
            revision = await self._guarded(ops, guard=guard)
            if revision is None:
                break
            guard = revision
            revisions.extend([revision] * len(chunk))
        return revisions

    def parts(self, commit: Commit) -> list[Part]:
        """`commit` as transactions within etcd's limits (one when it fits), in the order that
        keeps what a later one needs in the store before it: deletes first (addresses and
        users, then spaces with all they hold, then space plans, then address plans), then puts
        (address plans, space plans, spaces, addresses with subscriptions last, users). A space
        and its emptying stay in one transaction. TooLarge when one object cannot fit at all."""
        groups = [*self._delete_groups(commit), *self._put_groups(commit)]
        budget = self._max_request_bytes - _TXN_SLACK_BYTES
        parts: list[Part] = []
        part, size = Part(ops=[], keys=[]), 0
        for key, ops, weight in groups:
            if weight > budget:
                raise TooLarge(key, weight, budget)
            if part.ops and (
                len(part.ops) + len(ops) >= self._max_txn_ops or size + weight > budget
            ):
                parts.append(part)
                part, size = Part(ops=[], keys=[]), 0
            part.ops.extend(ops)
            part.keys.append(key)
            size += weight
        if part.ops:
            parts.append(part)
        return parts

    async def commit_part(self, part: Part, *, guard: int) -> int | None:
        """One part of `parts`, if the guard is still at `guard`: the new revision, or None."""
        return await self._guarded(part.ops, guard=guard)

    def _delete_groups(self, commit: Commit) -> list[tuple[Key, list[Any], int]]:
        order = {"Address": 0, "MessagingUser": 0, "AddressSpace": 1, "AddressSpacePlan": 2}
        groups = []
        for key in sorted(commit.deletes, key=lambda k: order.get(k[0], 3)):
            raw = self.key(key)
            ops = [rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=raw))]
            if key[0] == "AddressSpace" and key[2] in commit.emptied_spaces:
                for kind in SPACE_SCOPED_KINDS:
                    start, end = self._range_of(kind, key[2])
                    request = rpc.DeleteRangeRequest(key=start, range_end=end)
                    ops.append(rpc.RequestOp(request_delete_range=request))
            groups.append((key, ops, (2 * len(raw) + _OP_OVERHEAD_BYTES) * len(ops)))
        deleted = {key[2] for key in commit.deletes if key[0] == "AddressSpace"}
        for space in commit.emptied_spaces:
            if space not in deleted:  # emptied without its own delete: not something Apply does
                for kind in SPACE_SCOPED_KINDS:
                    start, end = self._range_of(kind, space)
                    request = rpc.DeleteRangeRequest(key=start, range_end=end)
                    op = rpc.RequestOp(request_delete_range=request)
                    groups.append((("AddressSpace", "", space), [op], 2 * len(start)))
        return groups

    def _put_groups(self, commit: Commit) -> list[tuple[Key, list[Any], int]]:
        order = {"AddressPlan": 0, "AddressSpacePlan": 1, "AddressSpace": 2, "Address": 3}

        def rank(item: tuple[Key, AnyObject]) -> int:
            key, obj = item
            subscription = key[0] == "Address" and obj.spec.type == "subscription"  # type: ignore[union-attr]
            return 4 if subscription else order.get(key[0], 5)

        groups = []
        for key, obj in sorted(commit.puts.items(), key=rank):
            raw, value = self.key(key), _stored_form(obj)
            op = rpc.RequestOp(request_put=rpc.PutRequest(key=raw, value=value))
            groups.append((key, [op], len(raw) + len(value) + _OP_OVERHEAD_BYTES))
        return groups

    def _transactions(self, puts: list[tuple[bytes, bytes]]) -> list[list[tuple[bytes, bytes]]]:
        """`puts` cut into transactions of at most max_txn_ops operations (the guard's put is one
        of them) and under max_request_bytes each."""
        budget = self._max_request_bytes - _TXN_SLACK_BYTES
        chunks: list[list[tuple[bytes, bytes]]] = []
        chunk: list[tuple[bytes, bytes]] = []
        size = 0
        for key, value in puts:
            weight = len(key) + len(value) + _OP_OVERHEAD_BYTES
            if chunk and (len(chunk) + 1 >= self._max_txn_ops or size + weight > budget):
                chunks.append(chunk)
                chunk, size = [], 0
            chunk.append((key, value))
            size += weight
        if chunk:
            chunks.append(chunk)
        return chunks

    async def _guarded(self, ops: list[Any], *, guard: int) -> int | None:
        """`ops` and a bump of the guard in ONE transaction, if the guard is still at `guard`:
        the new revision, or None when somebody wrote in between."""
        ops = [*ops, rpc.RequestOp(request_put=rpc.PutRequest(key=self._guard, value=b""))]
        compare = rpc.Compare(
            key=self._guard,
            target=rpc.Compare.MOD,
            result=rpc.Compare.EQUAL,
            mod_revision=guard,
        )
        response = await self._call(self._kv.Txn, rpc.TxnRequest(compare=[compare], success=ops))
        return int(response.header.revision) if response.succeeded else None

    async def compact(self, revision: int) -> None:
        """Drops history before `revision` (tests and operators; etcd can also do it by itself)."""
        await self._call(self._kv.Compact, rpc.CompactionRequest(revision=revision, physical=True))

    async def guard_revision(self) -> int:
        """The mod revision of the guard: the revision of the last write (0: none yet)."""
        response = await self._call(self._kv.Range, rpc.RangeRequest(key=self._guard))
        return int(response.kvs[0].mod_revision) if response.kvs else 0

    async def revision(self) -> int:
        request = rpc.RangeRequest(key=self._guard, count_only=True)
        return int((await self._call(self._kv.Range, request)).header.revision)

    # ---------------------------------------------------------------- access tokens

    async def token(self, digest: str) -> config_pb2.Token | None:
        """The record of the token whose secret hashes to `digest`, if there is one."""
        response = await self._call(
            self._kv.Range, rpc.RangeRequest(key=self._tokens + digest.encode())
        )
        if not response.kvs:
            return None
        return config_pb2.Token.FromString(response.kvs[0].value)

    async def tokens(self) -> list[config_pb2.Token]:
        start = self._tokens
        request = rpc.RangeRequest(key=start, range_end=_prefix_end(start))
        response = await self._call(self._kv.Range, request)
        found = [config_pb2.Token.FromString(kv.value) for kv in response.kvs]
        return sorted(found, key=lambda token: token.name)

    async def token_digest(self, name: str) -> tuple[str, int]:
        """(the digest of the token called `name`, the mod revision of its name key); ("", 0)
        when there is no such token."""
        request = rpc.RangeRequest(key=self._token_names + name.encode())
        response = await self._call(self._kv.Range, request)
        if not response.kvs:
            return "", 0
        return response.kvs[0].value.decode(), int(response.kvs[0].mod_revision)

    async def put_token(
        self, token: config_pb2.Token, *, digest: str, replacing: tuple[str, int] = ("", 0)
    ) -> bool:
        """Stores `token` under `digest` and its name, if the name still points where
        `replacing` says (("", 0): nowhere); the replaced token's record goes. False when the
        name moved meanwhile (or exists, for a new one)."""
        old_digest, name_revision = replacing
        name_key = self._token_names + token.name.encode()
        ops = [
            rpc.RequestOp(request_put=rpc.PutRequest(key=name_key, value=digest.encode())),
            rpc.RequestOp(
                request_put=rpc.PutRequest(
                    key=self._tokens + digest.encode(), value=token.SerializeToString()
                )
            ),
        ]
        if old_digest and old_digest != digest:
            old = rpc.DeleteRangeRequest(key=self._tokens + old_digest.encode())
            ops.append(rpc.RequestOp(request_delete_range=old))
        compare = rpc.Compare(
            key=name_key,
            target=rpc.Compare.MOD,
            result=rpc.Compare.EQUAL,
            mod_revision=name_revision,
        )
        response = await self._call(self._kv.Txn, rpc.TxnRequest(compare=[compare], success=ops))
        return bool(response.succeeded)

    async def save_token(self, token: config_pb2.Token, *, digest: str) -> None:
        """Writes a changed record (revoked) of an existing token back."""
        put = rpc.PutRequest(key=self._tokens + digest.encode(), value=token.SerializeToString())
        await self._call(self._kv.Put, put)

    # ---------------------------------------------------------------- watch

    async def watch(
        self, *, start_revision: int, with_guard: bool = False
    ) -> AsyncIterator[WatchBatch]:
        """Every change of a resource key from `start_revision` on, one batch per etcd response
        (`with_guard`: the guard's changes move `WatchBatch.revision` too).

        Raises Compacted when etcd no longer has `start_revision`, StoreUnavailable when the
        stream breaks (etcd restarted or unreachable).
        """
        start = f"{self.prefix}/".encode() if with_guard else self._resources
        create = rpc.WatchCreateRequest(
            key=start,
            range_end=_prefix_end(start),
            start_revision=start_revision,
            prev_kv=True,
            progress_notify=True,
        )
        call = self._watch.Watch(_hold_open(rpc.WatchRequest(create_request=create)))
        try:
            async for response in call:
                if response.compact_revision:
                    raise Compacted(int(response.compact_revision))
                if response.canceled:
                    raise StoreUnavailable(f"etcd cancelled the watch: {response.cancel_reason}")
                if response.created:
                    continue
                yield self._batch_of(response)
            raise StoreUnavailable("etcd closed the watch stream")
        except grpc.aio.AioRpcError as error:
            raise StoreUnavailable(f"etcd watch failed: {error.details()}") from error
        finally:
            call.cancel()

    def _batch_of(self, response: Any) -> WatchBatch:
        if not response.events:
            revision = int(response.header.revision)
            return WatchBatch(progress_revision=revision, revision=revision)
        batch = WatchBatch()
        for event in response.events:
            batch.revision = max(batch.revision, int(event.kv.mod_revision))
            key = self.parse_key(event.kv.key)
            if key is None:
                continue
            deleted = event.type == rpc.Event.DELETE
            batch.changes.append(self._change(key, event, deleted=deleted))
        return batch

    def _change(self, key: Key, event: Any, *, deleted: bool) -> Change:
        kv = event.kv
        if not deleted:
            obj: AnyObject = self._decode(key, kv.value, kv.mod_revision)
            created = kv.create_revision == kv.mod_revision
            return Change("put", key, obj, int(kv.mod_revision), created)
        if event.HasField("prev_kv"):
            obj = self._decode(key, event.prev_kv.value, event.prev_kv.mod_revision)
        else:  # the previous value was compacted away: name the object at least
            obj = KINDS[key[0]].message()
            obj.metadata.name = key[2]
            obj.metadata.space = key[1]
        return Change("delete", key, obj, int(kv.mod_revision), False)

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            if error.code() in _REFUSALS:
                raise StoreRefused(error.code(), error.details() or "") from error
            raise StoreUnavailable(f"etcd: {error.code().name}: {error.details()}") from error


def channel_target(endpoints: Sequence[str]) -> str:
    """The gRPC target for etcd's endpoints: gRPC fails over between the members itself.

    IP literals go into one `ipv4:` target. Host names cannot share a target; the first one is
    used, and it should be a DNS name that resolves to every member (the headless Service in
    Kubernetes), which gRPC's resolver then fails over between.
    """
    if len(endpoints) == 1:
        return endpoints[0]
    hosts = [endpoint.rpartition(":")[0] for endpoint in endpoints]
    if all(_is_ipv4(host) for host in hosts):
        return "ipv4:" + ",".join(endpoints)
    log.warning(
        "several etcd host names: using the first; give one name that resolves to all members",
        used=endpoints[0],
    )
    return endpoints[0]


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def _stored_form(obj: AnyObject) -> bytes:
    stored = type(obj)()
    stored.CopyFrom(obj)
    stored.metadata.resource_version = 0
    return stored.SerializeToString()


def _prefix_end(prefix: bytes) -> bytes:
    end = bytearray(prefix)
    end[-1] += 1  # prefixes here end in "/", never in 0xff
    return bytes(end)


async def _hold_open(first: Any) -> AsyncIterator[Any]:
    """The request side of a watch: one create request, then silence until cancelled."""
    yield first
    await asyncio.Event().wait()
