# Type stubs for the C extension enmasse.amqp_hotpath (src/enmasse/amqp_hotpath.c tells its story).
from collections.abc import Iterable
from typing import Any

TRANSFER: int
PARTIAL: int
OUTCOME: int
READ_AGAIN: int
READ_EOF: int
READ_INPUT_CLOSED: int
WRITE_DONE: int
WRITE_HEAD_CLOSED: int
WRITE_BLOCKED: int
FUNCTIONS: tuple[str, ...]

def bind(addresses: dict[str, int], kinds: Iterable[int], /) -> None: ...
def next_event(collector: int, /) -> tuple[Any, ...] | None:
    """(TRANSFER, link, delivery or 0, payload), (PARTIAL, link, bytes so far),
    (OUTCOME, delivery, remote state) or (event type, connection, link or session or 0)."""

def send(link: int, tag: int | bytes, payload: bytes, settled: bool, /) -> int: ...
def settle(delivery: int, state: int, /) -> None: ...
def credit(link: int, /) -> int: ...
def read(transport: int, fd: int, max_reads: int, /) -> tuple[int, int]: ...
def write(transport: int, fd: int, /) -> int: ...
