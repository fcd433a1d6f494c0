"""The journal: durable messages and their acks, append-only, checksummed, group-committed.

What flows in: `enqueue(msg_id, queues, payload, expires_at)` when a durable message arrives on a
persistent queue (one record, however many subscription queues it fans out to), `ack(msg_id, queue)`
when a queue lets it go, `after_commit(callback)` for what must wait until the records are on disk
(settling the producer's delivery). A batch (`take_batch`) is everything appended since the last
one; it is written with ONE fsync (`write_batch`), then every callback of the batch runs
(`finish_batch`): group commit. `commit()` does the three in a row; in the broker process a
`GroupCommitter` thread does the writing, so the engine loop never waits for the disk.
What flows out, at start: `recover()` returns every message that was enqueued and not
acknowledged, per queue, in id order.

Record on disk: `<u32 body length><u32 crc32(body)><body>`; body starts with a type byte:
- ENQUEUE: u64 msg id, u64 expires-at ms, u16 queue count, (u16 len, utf-8 name) per queue, payload.
- ACK: u64 msg id, utf-8 queue name.
- COUNT: u64 msg id, u32 delivery-count, u32 failed attempts, utf-8 queue name: written when a
  journaled message comes back to its queue with a new count (released, modified with
  delivery-failed, its consumer gone), in the same group commit as whatever else happened then.
  Recovery applies the last COUNT of (message, queue), so the delivery-count a consumer sees and
  the max-delivery-attempts rule go on counting across a restart. Only redeliveries write it:
  a message consumed at the first attempt costs nothing more. Failed attempts DEAD_LETTER_HELD
  (0xFFFFFFFF) mark a dead letter held in its queue (no dead-letter queue on the broker): it is
  recovered held, not ready.
- TXN: the records of one committed transaction (ENQUEUE, ACK, COUNT, each framed as above),
  in ONE record under one checksum (`atomic()`): a crash leaves all of them or none. Recovery
  applies them as if they stood alone (transactions.py writes it at discharge).

Versioning: the type byte is the format's version. Types are only ever added, never changed, so
a segment written by older code (ENQUEUE and ACK only) recovers unchanged; a type this code does
not know ends that segment's replay like a corrupt record, with a log line (never a crash).

Segments `NNNNNNNN.jnl` roll over at `segment_bytes`. A segment is reclaimed (deleted) once every
message enqueued in it and in every older segment is acknowledged; reclaiming oldest-first only
means an ACK record never outlives a segment that still holds its message. A torn or corrupt record
(short read, bad length, bad checksum: what a SIGKILL or a disk fault leaves) ends that segment's
replay with a log line; recovery goes on with the next segment and never crashes. A new segment is
opened at each start, so a torn tail is never appended to.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue as queues_
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

_FRAME = struct.Struct("<II")
_ENQUEUE_HEAD = struct.Struct("<BQQH")
_ACK_HEAD = struct.Struct("<BQ")
_COUNT_HEAD = struct.Struct("<BQII")
_NAME_LEN = struct.Struct("<H")
_ENQUEUE = 1
_ACK = 2
_COUNT = 3
_TXN = 4
_SUFFIX = ".jnl"
_MAX_RECORD = 1 << 30
_U32 = 0xFFFFFFFF
DEAD_LETTER_HELD = _U32
"""A COUNT record's failed attempts for a dead letter held in its queue (see the docstring)."""


@dataclass
class Recovered:
    """What `recover` found: messages per queue in id order, and what it had to skip."""

    messages: dict[str, list[tuple[int, bytes, int]]] = field(default_factory=dict)
    next_id: int = 1
    # (queue, msg id) -> (delivery count, failed attempts), for redelivered messages only
    counts: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    corrupt_segments: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.messages.values())


@dataclass(slots=True)
class Batch:
    """Records on their way to disk, and what to run once they are there."""

    data: bytearray
    callbacks: list[Callable[[], None]]
    fd: int


class _Live:
    """A journaled message's bookkeeping: its segment, and how many queues still hold it."""

    __slots__ = ("refs", "segment")

    def __init__(self, segment: int, refs: int) -> None:
        self.segment = segment
        self.refs = refs


class Journal:
    def __init__(self, directory: Path, *, segment_bytes: int = 64 << 20) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        directory.mkdir(parents=True, exist_ok=True)
        self._buffer = bytearray()
        self._callbacks: list[Callable[[], None]] = []
        self._live: dict[int, _Live] = {}
        self._segment_live: dict[int, int] = {}  # segment number -> messages still live in it
        self._segments: list[int] = []  # on disk, oldest first (the current one last)
        self._unplaced: list[_Live] = []  # enqueued since the last batch was taken
        self._fd = -1
        self._current = 0
        self._current_size = 0
        self.commits = 0
        self.records = 0

    # ------------------------------------------------------------------ start

    def recover(self) -> Recovered:
        """Replays every segment, opens a fresh one for writing, reclaims what is fully acked."""
        found: dict[int, tuple[list[str], bytes, int, int]] = {}
        counts: dict[tuple[str, int], tuple[int, int]] = {}
        result = Recovered()
        numbers = sorted(
            int(p.stem) for p in self.directory.glob(f"*{_SUFFIX}") if p.stem.isdigit()
        )
        max_id = 0
        for number in numbers:
            path = self._path(number)
            clean = True
            for kind, msg_id, rest in _read_records(path):
                if kind is None:
                    clean = False
                    break
                max_id = max(max_id, msg_id)
                if kind == _ENQUEUE:
                    queues, payload, expires_at = rest
                    found[msg_id] = (list(queues), payload, expires_at, number)
                elif kind == _COUNT:
                    queue_name, delivery_count, failed = rest
                    counts[(queue_name, msg_id)] = (delivery_count, failed)
                else:
                    known = found.get(msg_id)
                    if known is not None and rest in known[0]:
                        known[0].remove(rest)
            if not clean:
                result.corrupt_segments.append(path.name)
        self._segments = list(numbers)
        self._segment_live = dict.fromkeys(numbers, 0)
        for msg_id in sorted(found):
            queues, payload, expires_at, number = found[msg_id]
            if not queues:
                continue
            self._live[msg_id] = _Live(number, len(queues))
            self._segment_live[number] += 1
            for queue in queues:
                result.messages.setdefault(queue, []).append((msg_id, payload, expires_at))
                count = counts.get((queue, msg_id))
                if count is not None:
                    result.counts[(queue, msg_id)] = count
        result.next_id = max_id + 1
        self._open_segment((numbers[-1] + 1) if numbers else 1)
        self._reclaim()
        log.info(
            "journal recovered",
            segments=len(numbers),
            messages=len(self._live),
            corrupt_segments=result.corrupt_segments,
        )
        return result

    # ------------------------------------------------------------------ appending

    def enqueue(
        self, *, msg_id: int, queues: Iterable[str], payload: bytes, expires_at: int
    ) -> None:
        names = [q.encode() for q in queues]
        parts = [_ENQUEUE_HEAD.pack(_ENQUEUE, msg_id, expires_at, len(names))]
        for name in names:
            parts.append(_NAME_LEN.pack(len(name)))
            parts.append(name)
        self._append(b"".join(parts), payload)
        # Its segment is known only when its batch is handed to the writer (`take_batch`).
        live = _Live(-1, len(names))
        self._live[msg_id] = live
        self._unplaced.append(live)

    def ack(self, *, msg_id: int, queue: str) -> None:
        live = self._live.get(msg_id)
        if live is None:
            return
        self._append(_ACK_HEAD.pack(_ACK, msg_id) + queue.encode())
        live.refs -= 1
        if live.refs <= 0:
            del self._live[msg_id]
            if live.segment >= 0:
                self._segment_live[live.segment] -= 1

    def count(self, *, msg_id: int, queue: str, delivery_count: int, failed: int) -> None:
        """A live message's new delivery count in one queue (it was redelivered)."""
        if msg_id not in self._live:
            return
        head = _COUNT_HEAD.pack(_COUNT, msg_id, min(delivery_count, _U32), min(failed, _U32))
        self._append(head + queue.encode())

    def _append(self, body: bytes, payload: bytes = b"") -> None:
        """Frames body + payload as one record. The payload (a message, up to the largest a plan
        allows) is not joined to the body first: it is copied once, into the batch, and no more."""
        crc = zlib.crc32(payload, zlib.crc32(body))
        self._buffer += _FRAME.pack(len(body) + len(payload), crc)
        self._buffer += body
        self._buffer += payload
        self.records += 1

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """What is appended inside goes to disk as ONE TXN record: recovered all or nothing."""
        outer, self._buffer = self._buffer, bytearray()
        try:
            yield
        finally:
            inner, self._buffer = self._buffer, outer
            if inner:
                self._append(bytes((_TXN,)) + inner)

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    @property
    def pending(self) -> bool:
        return bool(self._buffer or self._callbacks)

    # ------------------------------------------------------------------ group commit

    def take_batch(self) -> Batch | None:
        """Hands over everything appended since the last batch (engine thread, writer idle)."""
        if not self._buffer and not self._callbacks:
            return None
        if self._current_size >= self.segment_bytes:
            self._open_segment(self._current + 1)
        for live in self._unplaced:
            if live.refs > 0:
                live.segment = self._current
                self._segment_live[self._current] += 1
        self._unplaced = []
        batch = Batch(data=self._buffer, callbacks=self._callbacks, fd=self._fd)
        self._buffer = bytearray()
        self._callbacks = []
        self._current_size += len(batch.data)
        return batch

    @staticmethod
    def write_batch(batch: Batch) -> None:
        """Writes the batch and calls fdatasync ONCE (any thread: the group committer's)."""
        view = memoryview(batch.data)
        while view:
            n = os.write(batch.fd, view)
            view = view[n:]
        if batch.data:
            os.fdatasync(batch.fd)

    def finish_batch(self, batch: Batch) -> None:
        """The batch is on disk: settle what waited for it, reclaim (engine thread)."""
        if batch.data:
            self.commits += 1
        for callback in batch.callbacks:
            callback()
        self._reclaim()

    def commit(self) -> int:
        """Writes the batch, ONE fsync, then runs the batch's callbacks; returns bytes written."""
        batch = self.take_batch()
        if batch is None:
            return 0
        self.write_batch(batch)
        self.finish_batch(batch)
        return len(batch.data)

    def close(self) -> None:
        """Writes what is buffered; the callbacks are dropped (their connections are gone)."""
        self._callbacks = []
        self.commit()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # ------------------------------------------------------------------ segments

    @property
    def live_messages(self) -> int:
        return len(self._live)

    @property
    def segment_numbers(self) -> list[int]:
        return list(self._segments)

    def _path(self, number: int) -> Path:
        return self.directory / f"{number:08d}{_SUFFIX}"

    def _open_segment(self, number: int) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self._path(number), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        _fsync_directory(self.directory)  # the new name itself must survive a crash
        self._current = number
        self._current_size = 0
        self._segments.append(number)
        self._segment_live[number] = 0

    def _reclaim(self) -> None:
        while len(self._segments) > 1 and self._segment_live.get(self._segments[0], 0) == 0:
            oldest = self._segments.pop(0)
            self._segment_live.pop(oldest, None)
            self._path(oldest).unlink(missing_ok=True)
            log.debug("journal segment reclaimed", segment=oldest)


def _read_records(path: Path) -> Iterable[tuple[int | None, int, Any]]:
    """Yields (kind, msg_id, rest) per good record; (None, 0, None) once at a torn/bad record."""
    data = path.read_bytes()
    pos = 0
    end = len(data)
    while pos < end:
        problem = ""
        if end - pos < _FRAME.size:
            problem = "torn frame header"
        else:
            length, crc = _FRAME.unpack_from(data, pos)
            start = pos + _FRAME.size
            if length > _MAX_RECORD or start + length > end:
                problem = "torn record"
            elif zlib.crc32(data[start : start + length]) != crc:
                problem = "checksum mismatch"
        if problem:
            log.warning(
                "journal tail skipped",
                segment=path.name,
                offset=pos,
                bytes=end - pos,
                reason=problem,
            )
            yield None, 0, None
            return
        try:
            decoded = _decode_all(data[start : start + length])
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            log.warning("journal record undecodable", segment=path.name, offset=pos, error=str(exc))
            yield None, 0, None
            return
        pos = start + length
        yield from decoded


def _decode_all(body: bytes) -> list[tuple[int, int, Any]]:
    """A record's contents: the record itself, or every record a TXN record holds."""
    if body[0] != _TXN:
        return [_decode(body)]
    records = []
    pos, end = 1, len(body)
    while pos < end:
        length, crc = _FRAME.unpack_from(body, pos)
        start = pos + _FRAME.size
        inner = body[start : start + length]
        if len(inner) != length or zlib.crc32(inner) != crc:
            raise ValueError("transaction record holds a corrupt record")
        records.append(_decode(inner))
        pos = start + length
    return records


def _decode(body: bytes) -> tuple[int, int, Any]:
    kind = body[0]
    if kind == _ENQUEUE:
        _, msg_id, expires_at, count = _ENQUEUE_HEAD.unpack_from(body, 0)
        at = _ENQUEUE_HEAD.size
        queues = []
        for _ in range(count):
            (n,) = _NAME_LEN.unpack_from(body, at)
            at += _NAME_LEN.size
            queues.append(body[at : at + n].decode())
            at += n
        return _ENQUEUE, msg_id, (queues, body[at:], expires_at)
    if kind == _COUNT:
        _, msg_id, delivery_count, failed = _COUNT_HEAD.unpack_from(body, 0)
        return _COUNT, msg_id, (body[_COUNT_HEAD.size :].decode(), delivery_count, failed)
    if kind != _ACK:
        raise ValueError(f"unknown record type {kind}")
    _, msg_id = _ACK_HEAD.unpack_from(body, 0)
    return _ACK, msg_id, body[_ACK_HEAD.size :].decode()


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class GroupCommitter:
    """A writer thread that overlaps fsync with the engine loop.

    The engine thread calls `kick()` whenever records or callbacks are pending. If the writer is
    idle, the pending batch is handed to it; while it writes and fsyncs, the loop keeps reading,
    dispatching and appending, so the next batch grows by everything that arrived meanwhile: one
    fsync covers as many deliveries as the disk's latency lets accumulate. When a batch is on
    disk, `post` (the engine's call_soon_threadsafe) brings `finish_batch` back to the engine
    thread, which settles the batch's deliveries and hands over the next batch at once.
    A failed write or fsync is fatal for durability: `on_failure` is called and nothing more is
    settled.
    """

    def __init__(
        self,
        journal: Journal,
        *,
        post: Callable[[Callable[[], None]], object],
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self.journal = journal
        self._post = post
        self._on_failure = on_failure
        self._batches: queues_.SimpleQueue[Batch | None] = queues_.SimpleQueue()
        self._busy = False
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._thread.start()

    def kick(self) -> None:
        if self._busy or self._failed:
            return
        batch = self.journal.take_batch()
        if batch is not None:
            self._busy = True
            self._batches.put(batch)

    def stop(self) -> None:
        self._batches.put(None)
        self._thread.join(30)

    def _run(self) -> None:
        while (batch := self._batches.get()) is not None:
            try:
                Journal.write_batch(batch)
            except OSError as exc:
                self._post(functools.partial(self._fail, exc))
                return
            self._post(functools.partial(self._done, batch))
            del batch  # it may hold a 100 MiB message: not kept while the writer waits

    def _done(self, batch: Batch) -> None:
        self._busy = False
        self.journal.finish_batch(batch)
        self.kick()

    def _fail(self, exc: BaseException) -> None:
        self._failed = True
        log.critical(
            "journal write failed; durable messages can no longer be accepted", error=str(exc)
        )
        self._on_failure(exc)
