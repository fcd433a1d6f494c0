"""Large incoming deliveries: taken out of proton in chunks as their frames come, joined once,
and, over the link's size limit, thrown away as they come and refused for their sender alone.

What flows in: from the engine's event loop (`events.Engine`), the PARTIAL records of a delivery
still arriving (`on_partial`: its link and the bytes proton holds of it so far) and, on a link
that has such a delivery under way or whose transfer is over its size limit, the complete
transfer (`completed`: its link, delivery pointer, the last bytes). What flows out: the whole
message, joined once, for the link's handler; or a disposition REJECTED with
amqp:link:message-size-exceeded ("message of N bytes exceeds the limit of L bytes") and the
credit the refused message used given back; the handler never sees it, the link and the
connection go on.

Why it is built so:
- proton keeps a delivery's bytes in a buffer that doubles as frames arrive and that its delivery
  pool keeps afterwards: a 100 MiB message would leave a 128 MiB buffer behind on its connection,
  beside the message's own bytes. Chunks of at least `CHUNK_BYTES` are read out as they arrive
  (each into a bytearray of its size: one copy) and joined once at the end, so proton's buffer
  stays about one chunk and the message is held twice only during that join;
- an oversized message is never held: once its bytes so far pass the limit, what arrived is
  dropped and every later frame read into a scratch buffer and dropped, its size still counted
  so the refusal names it. Refusing per delivery, not by detaching the link, matters because a
  standard space's router and brokers share one link among many producers: a detach would end
  (and RELEASE) everybody's deliveries on it;
- the engine's per-transfer cost is one size comparison (`len(payload) > link._size_ceiling`):
  the ceiling is the link's limit, or -1 while an assembly is under way so that the last transfer
  of it comes here. A sender may abort a delivery mid-way (proton drops it without an event), so
  the assembly remembers its delivery tag and a complete transfer with another tag starts afresh
  (a pre-settled transfer has no tag to compare: it is taken as the assembly's last part).
"""

from __future__ import annotations

from typing import Any

import structlog
from cproton_ffi import ffi, lib
from enmasse.amqp.engine.endpoints import NO_SIZE_LIMIT, Delivery, Link
from enmasse.amqp.wire import Condition, Outcome

log = structlog.get_logger("enmasse.amqp")

SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
CHUNK_BYTES = 1 << 20  # proton's buffer is emptied into a chunk once it holds this much

_SCRATCH_BYTES = 1 << 16
_scratch = ffi.new("char[]", _SCRATCH_BYTES)  # what an oversized delivery is read into (one thread)


class Assembly:
    """A delivery under way on one link: its chunks so far, or how much of it was thrown away."""

    __slots__ = ("chunks", "discarded", "held", "tag")

    def __init__(self, tag: bytes) -> None:
        self.tag = tag
        self.chunks: list[bytes | bytearray] = []
        self.held = 0  # bytes in chunks
        self.discarded = 0  # > 0: oversized, its bytes thrown away (this many so far)


def on_partial(link: Link, size: int) -> None:
    """Part of a delivery arrived; proton holds `size` bytes of it not yet read out."""
    assembly = link._assembly
    if assembly is None:
        if size < CHUNK_BYTES and size <= link._size_ceiling:
            return  # proton may hold it for now: most large-ish messages end here
        assembly = link._assembly = Assembly(_tag(lib.pn_link_current(link._ptr)))
        link._size_ceiling = -1  # its last transfer comes to `completed`
    limit = link._max_message_size or NO_SIZE_LIMIT
    if assembly.discarded or assembly.held + size > limit:
        if not assembly.discarded:
            assembly.discarded = assembly.held
            assembly.chunks, assembly.held = [], 0
        assembly.discarded += _discard(link._ptr)
    elif size >= CHUNK_BYTES:
        assembly.chunks.append(_take(link._ptr, size))
        assembly.held += size


def completed(link: Link, dptr: int, payload: bytes) -> bytes | None:
    """A complete transfer over the link's size ceiling (`payload`: what proton still held of
    it): the whole message to hand on, or None when it was refused."""
    assembly = link._assembly
    if assembly is not None:
        link._assembly = None
        link._size_ceiling = link._max_message_size or NO_SIZE_LIMIT
        if not dptr or _tag(ffi.cast("pn_delivery_t *", dptr)) == assembly.tag:
            if assembly.discarded:
                _refuse(link, dptr, assembly.discarded + len(payload))
                return None
            if assembly.chunks:
                assembly.chunks.append(payload)  # the tail
                payload = b"".join(assembly.chunks)
                assembly.chunks.clear()
        # else the delivery assembled was aborted by its sender: this one is another
    if len(payload) > link._size_ceiling:
        _refuse(link, dptr, len(payload))
        return None
    return payload


def _refuse(link: Link, dptr: int, size: int) -> None:
    error = Condition(
        SIZE_EXCEEDED,
        f"message of {size} bytes exceeds the limit of {link._max_message_size} bytes",
    )
    if dptr:
        Delivery(link, dptr, b"", False).settle(Outcome.REJECTED, error=error)
    else:  # sent pre-settled: nobody to tell, the message is gone (at most once)
        log.warning("oversized pre-settled message dropped", link=link.name, size=size)
    link.flow(1)  # the credit it used: the handler never saw it, so it still counts on it


def _take(link_ptr: Any, size: int) -> bytearray:
    """Reads the `size` bytes proton holds of the link's current delivery into a new chunk."""
    chunk = bytearray(size)
    got = lib.pn_link_recv(link_ptr, ffi.from_buffer(chunk), size)
    if got < size:
        del chunk[max(got, 0) :]
    return chunk


def _discard(link_ptr: Any) -> int:
    """Reads and throws away what proton holds of the link's current delivery; the byte count."""
    thrown = 0
    while (got := lib.pn_link_recv(link_ptr, _scratch, _SCRATCH_BYTES)) > 0:
        thrown += got
    return thrown


def _tag(delivery_ptr: Any) -> bytes:
    tag = lib.pn_delivery_tag(delivery_ptr)
    return bytes(ffi.buffer(tag.start, tag.size)) if tag.size else b""
