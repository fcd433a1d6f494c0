"""Every page of a ConfigService List: the one place a client follows `continue_token`.

In: a List call (the stub's method, or a function around it that adds credentials and
deadlines) and the first request. Out: the items of every page, in order, as one list.

Why every in-tree client goes through here: the config service answers a List one page at a
time (`config.proto`, ListRequest), and a client that reads only `reply.items` of the first
answer sees the first 500 objects and believes that is all. Each page repeats the request with
the previous page's token, so the pages are one snapshot of the store (read at one revision);
a token that expired meanwhile (its revision compacted: OUT_OF_RANGE) is raised to the caller,
who lists again from the start, since a list glued from two snapshots would not be one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from enmasse.v1 import config_pb2

MAX_PAGES = 100_000
"""A server that kept answering with a token would otherwise hold a client forever."""


class ListReply(Protocol):
    """What every `<Kind>List` answer has (`config_pb2.AddressList`, ...)."""

    @property
    def items(self) -> Sequence[Any]: ...

    @property
    def continue_token(self) -> str: ...


Reply = TypeVar("Reply", bound=ListReply)


def every_item(
    call: Callable[[config_pb2.ListRequest], Reply], request: config_pb2.ListRequest
) -> list[Any]:
    """The items of every page of a blocking List `call` (the CLI's)."""
    items: list[Any] = []
    page = _first(request)
    for _ in range(MAX_PAGES):
        reply = call(page)
        items.extend(reply.items)
        if not reply.continue_token:
            return items
        page.continue_token = reply.continue_token
    raise RuntimeError(f"a List went on for more than {MAX_PAGES} pages")


async def every_item_async(
    call: Callable[[config_pb2.ListRequest], Awaitable[Reply]], request: config_pb2.ListRequest
) -> list[Any]:
    """The items of every page of an asyncio List `call` (the console's, the controllers')."""
    items: list[Any] = []
    page = _first(request)
    for _ in range(MAX_PAGES):
        reply = await call(page)
        items.extend(reply.items)
        if not reply.continue_token:
            return items
        page.continue_token = reply.continue_token
    raise RuntimeError(f"a List went on for more than {MAX_PAGES} pages")


def _first(request: config_pb2.ListRequest) -> config_pb2.ListRequest:
    page = config_pb2.ListRequest()
    page.CopyFrom(request)  # the caller's request stays as it was
    return page
