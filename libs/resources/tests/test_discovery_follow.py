"""`follow_ports_files`: a reader is woken by ports files written or removed under the trees it
follows, and never by the journals and logs that sit beside them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from enmasse.resources.discovery import LocalDirectory, follow_ports_files, write_ports

QUIET = 1.0  # how long nothing must happen to count as "not woken"


async def _wakes(var: Path) -> list[str]:
    directory = LocalDirectory(var)
    woken = asyncio.Event()
    seen: list[str] = []

    def wake() -> None:
        seen.append("wake")
        woken.set()

    following = asyncio.create_task(follow_ports_files(directory.roots, wake))
    try:
        await asyncio.sleep(0.3)  # the watch is set up
        journal = var / "brokers" / "shop" / "broker-0" / "data" / "segment-1.log"
        journal.parent.mkdir(parents=True)
        journal.write_bytes(b"x" * 4096)
        (var / "routers").joinpath("router.log").write_text("a line\n")
        await asyncio.sleep(QUIET)
        assert seen == []  # a journal and a log do not wake it
        write_ports(var / "brokers" / "shop" / "broker-0" / "ports.json", {"amqp": 1, "admin": 2})
        async with asyncio.timeout(10):
            await woken.wait()
        woken.clear()
        (var / "brokers" / "shop" / "broker-0" / "ports.json").unlink()
        async with asyncio.timeout(10):
            await woken.wait()
    finally:
        following.cancel()
    return seen


def test_ports_files_wake_the_reader_and_nothing_else_does(tmp_path: Path) -> None:
    seen = asyncio.run(_wakes(tmp_path))
    assert seen == ["wake", "wake"]  # written, then removed: once each
