"""The gateway's MQTT listener: accepts TCP clients and gives each its own `Session`.

What flows in: TCP connections on the MQTT port. What flows out: one session task per client,
all sharing the one AMQP `Engine` (a thread of its own) that carries every client's connection
to the router. A session's failure ends that session: the listener and the other clients go on.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from enmasse.amqp.engine import Engine
from enmasse.mqtt_gateway.persistence import Connected, Sessions
from enmasse.mqtt_gateway.retained import RetainedStore
from enmasse.mqtt_gateway.session import RouterAddress, Session
from enmasse.mqtt_gateway.wills import Wills

log = structlog.get_logger("enmasse.mqtt_gateway")


class Gateway:
    """MQTT over TCP on `host:port` (0: a free port, read back from `port`)."""

    def __init__(
        self,
        *,
        engine: Engine,
        router: RouterAddress,
        sessions: Sessions | None = None,
        retained: RetainedStore | None = None,
        wills: Wills | None = None,
    ) -> None:
        self.engine = engine
        self.router = router
        self.retained = retained  # retained messages (retained.py); None: not kept
        self.wills = wills  # the will service (wills.py); None: wills not kept
        self.records = sessions  # persistent sessions' records; None: no session is kept
        self.connected = Connected()  # a client id connects once: a second takes it over
        self.sessions: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def listen(self, *, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._accept, host=host, port=port)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = Session(
            reader=reader,
            writer=writer,
            engine=self.engine,
            router=self.router,
            sessions=self.records,
            connected=self.connected,
            retained=self.retained,
            wills=self.wills,
        )
        task = asyncio.current_task()
        assert task is not None
        self.sessions.add(task)
        try:
            await session.run()
        except Exception:
            log.exception("mqtt session failed", client=session.client_id)
        finally:
            self.sessions.discard(task)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self.sessions):
            task.cancel()
        for task in list(self.sessions):
            with contextlib.suppress(BaseException):
                await task
