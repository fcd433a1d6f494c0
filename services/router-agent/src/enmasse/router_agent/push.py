"""The agent's side of one router: push a configuration, learn which generation it runs.

In: a `RouterConfig` to push, or a probe. Out: `applied` (the generation the router answered it
runs; 0 until it answers), `reachable`, and `error` (why it is behind, for people).

How a restart is noticed: a router that restarts comes back running generation 0 (or with the
configuration file it was started with). The agent probes every router it believes in sync with a
cheap `GetStats` for an address nobody uses (the answer carries the running generation, not the
whole configuration); an answer below the desired generation makes the agent push again. A router
that moved to another admin port is another `RouterSession` (the directory names it anew).

Errors are answers, not exceptions: a router that refuses (INVALID_ARGUMENT: a bug in the agent's
routes) or cannot be reached is recorded and retried on the next tick; a router that runs a NEWER
generation than pushed (an earlier agent process) reports it in `ahead`, so the space's generation
is moved above it.
"""

from __future__ import annotations

import contextlib

import grpc
import structlog
from enmasse.resources.contracts import SYSTEM_PREFIX
from enmasse.resources.discovery import RouterEndpoint
from enmasse.v1 import router_pb2, router_pb2_grpc

log = structlog.get_logger(__name__)

PUSH_DEADLINE = 10.0
PROBE_DEADLINE = 2.0
PROBE_ADDRESS = f"{SYSTEM_PREFIX}enmasse/router-agent/probe"  # never a client address


class RouterSession:
    def __init__(self, *, space: str, endpoint: RouterEndpoint) -> None:
        self.space = space
        self.endpoint = endpoint
        self.applied = 0
        self.pushed = 0  # the generation last pushed (answered or not)
        self.ahead = 0  # a generation above ours that the router runs
        self.reachable = False
        self.error = "not contacted yet"
        self.peers: list[str] = []
        self._channel = grpc.aio.insecure_channel(endpoint.admin)
        self._stub = router_pb2_grpc.RouterAdminStub(self._channel)
        self._log = log.bind(space=space, router=endpoint.router_id)

    async def push(self, config: router_pb2.RouterConfig) -> None:
        self.pushed = config.generation
        try:
            answer = await self._stub.ApplyConfig(config, timeout=PUSH_DEADLINE)
        except grpc.aio.AioRpcError as error:
            await self._refused(error, generation=config.generation)
            return
        self.applied = answer.generation
        self.reachable, self.error = True, ""
        self.peers = [p.router_id for p in config.peers]
        if answer.changed:
            self._log.info(
                "configuration applied",
                generation=answer.generation,
                addresses=len(config.addresses),
            )

    async def _refused(self, error: grpc.aio.AioRpcError, *, generation: int) -> None:
        code, details = error.code(), error.details() or ""
        before = self.error
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            running = await self.probe()
            self.ahead = max(self.ahead, running or 0)
            self.error = f"runs generation {running}, newer than {generation}"
        elif code == grpc.StatusCode.INVALID_ARGUMENT:
            self.reachable = True
            self.error = f"refused the configuration: {details}"
        else:
            self.reachable = False
            self.error = f"unreachable: {code.name} {details}".strip()
        if self.error != before:  # once per new problem, not once per pass
            self._log.warning("router did not apply", generation=generation, reason=self.error)

    async def probe(self) -> int | None:
        """The generation the router runs now (None when it does not answer)."""
        try:
            stats = await self._stub.GetStats(
                router_pb2.StatsRequest(address=PROBE_ADDRESS), timeout=PROBE_DEADLINE
            )
        except grpc.aio.AioRpcError as error:
            self.reachable = False
            self.error = f"unreachable: {error.code().name}"
            return None
        self.reachable = True
        if stats.generation < self.applied:
            self._log.info(
                "router restarted or lost its configuration",
                running=stats.generation,
                was=self.applied,
            )
        self.applied = stats.generation
        return int(stats.generation)

    async def stats(self, address: str) -> router_pb2.RouterStats | None:
        try:
            answer: router_pb2.RouterStats = await self._stub.GetStats(
                router_pb2.StatsRequest(address=address), timeout=PUSH_DEADLINE
            )
        except grpc.aio.AioRpcError:
            return None
        return answer

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._channel.close()
