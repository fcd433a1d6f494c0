"""Address statuses written many to a call, the way every controller writes them.

In: the statuses a controller's pass wants written, each as (the address as it read it, the new
status). Out: batches of at most `STATUS_BATCH` writes and their `UpdateAddressStatusesRequest`s,
each entry carrying the resource_version that was read (compare-and-swap: a write by somebody
else since is never overwritten), and `refused_entry`, which entry of a refused batch was stale
or gone: the config service names it in the trailing metadata `ENTRY_TRAILER` (this module is
that contract's one home: the config service sets it, the controllers read it).

Why batches: the config service commits one status write per etcd transaction behind one lock
(a few hundred a second); a batch is checked at once and committed in as few transactions as
etcd allows, so a pass over thousands of addresses costs a handful of calls. Why at most
`STATUS_BATCH` a call: a status is a few hundred bytes, so a request stays far below gRPC's
4 MiB message limit, and one call never holds the config service's write lock for long.

A batch is all or nothing: when one entry is stale (ABORTED) or its address gone (NOT_FOUND),
nothing of it is written. The controllers then send the batch again without that entry (which
gets what a stale single write gets: the next pass, on the informer's newer version), a few
times at most, and then one address at a time as before batches, so the other addresses'
statuses are not held back by one that raced.
A controller's own last write is the commonest race: its informer brings that write back a
moment later, and a pass in between would write the same status again on the old version and
spoil its whole batch. `OwnWrites` remembers each status written until the informer shows it,
so such an address is left out of the next batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import grpc
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

STATUS_BATCH = 1000
ENTRY_RETRIES = 8
"""How many refused entries a controller leaves out of one batch before it writes the rest one by
one (each refusal costs a call that writes nothing)."""
ENTRY_TRAILER = "enmasse-batch-entry"
"""Trailing metadata of a refused batch: the index of the entry that refused it."""
"""The most entries a controller puts in one UpdateAddressStatuses call."""
STATUS_BATCH_DEADLINE = 30.0
"""Seconds a controller gives one batch: a fraction of one on a quiet config service, several on
a loaded machine; a batch cut short may still be written whole, and the next pass sees it."""

StatusWrite = tuple[resources_pb2.Address, resources_pb2.AddressStatus]
"""(the address as the controller read it, the status it wants stored)."""


def status_request(
    address: resources_pb2.Address, status: resources_pb2.AddressStatus
) -> config_pb2.UpdateAddressStatusRequest:
    """The write of one address's status, on the resource_version the controller read."""
    return config_pb2.UpdateAddressStatusRequest(
        ref=config_pb2.ObjectRef(space=address.metadata.space, name=address.metadata.name),
        status=status,
        resource_version=address.metadata.resource_version,
    )


def status_batches(
    writes: Sequence[StatusWrite], *, size: int = STATUS_BATCH
) -> Iterator[list[StatusWrite]]:
    """The writes in batches of at most `size`, one call each."""
    for start in range(0, len(writes), size):
        yield list(writes[start : start + size])


def batch_request(batch: Sequence[StatusWrite]) -> config_pb2.UpdateAddressStatusesRequest:
    return config_pb2.UpdateAddressStatusesRequest(
        entries=[status_request(address, status) for address, status in batch]
    )


class OwnWrites:
    """The statuses this controller wrote that its informer has not brought back yet."""

    def __init__(self) -> None:
        self._written: dict[tuple[str, str], tuple[bytes, int]] = {}

    def pending(self, address: resources_pb2.Address, status: resources_pb2.AddressStatus) -> bool:
        """Whether `status` is what we last wrote to `address`, at a version newer than the one
        read (the informer is behind our own write): writing it again would only race."""
        key = (address.metadata.space, address.metadata.name)
        last = self._written.get(key)
        if last is None:
            return False
        if address.metadata.resource_version >= last[1]:
            del self._written[key]  # the informer caught up: nothing to remember any more
            return False
        return last[0] == status.SerializeToString(deterministic=True)

    def note(
        self, address: resources_pb2.Address, status: resources_pb2.AddressStatus, *, version: int
    ) -> None:
        key = (address.metadata.space, address.metadata.name)
        self._written[key] = (status.SerializeToString(deterministic=True), version)

    def __len__(self) -> int:
        return len(self._written)


@dataclass
class BatchOutcome:
    """What became of a batch: written (with each one's new resource_version), refused (stale or
    gone: left out), and the rest, unwritten, when too many were refused."""

    written: list[tuple[StatusWrite, int]] = field(default_factory=list)
    refused: list[StatusWrite] = field(default_factory=list)
    rest: list[StatusWrite] = field(default_factory=list)


async def write_batch(
    stub: config_pb2_grpc.ConfigServiceStub, batch: Sequence[StatusWrite], *, deadline: float
) -> BatchOutcome:
    """One batch through UpdateAddressStatuses, sent again without each entry that refuses it
    (at most ENTRY_RETRIES times). Raises the call's error when it fails as a whole."""
    outcome, pending = BatchOutcome(), list(batch)
    for _attempt in range(ENTRY_RETRIES):
        if not pending:
            return outcome
        try:
            answer = await stub.UpdateAddressStatuses(batch_request(pending), timeout=deadline)
        except grpc.aio.AioRpcError as error:
            culprit = refused_entry(error)
            if culprit is None or culprit >= len(pending):
                if not refused_by_an_entry(error):
                    raise
                break  # refused without naming the entry: the caller writes one by one
            outcome.refused.append(pending.pop(culprit))
            continue
        outcome.written = list(zip(pending, answer.resource_versions, strict=True))
        return outcome
    outcome.rest = pending
    return outcome


def refused_by_an_entry(error: grpc.aio.AioRpcError) -> bool:
    """Whether a batch failed because of one entry (stale, or its address deleted meanwhile)
    rather than as a whole (config away, a deadline): then writing the others helps."""
    return error.code() in (grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND)


def refused_entry(error: grpc.aio.AioRpcError) -> int | None:
    """The index of the entry a batch was refused for (stale or gone), if the answer names one."""
    if not refused_by_an_entry(error):
        return None
    for key, value in error.trailing_metadata() or ():
        if key == ENTRY_TRAILER and isinstance(value, str) and value.isdigit():
            return int(value)
    return None
