"""The agent's side of one router: push a configuration, learn which generation it runs.

In: a `RouterConfig` to push, or a probe; the state of the gRPC channel to the router. Out:
`applied` (the generation the router answered it runs; 0 until it answers, and 0 again as soon
as the router is lost), `reachable`, `error` (why it is behind, for people), and `confirmed_at`
(wall-clock time of the router's last answer that said which generation it runs).

How a lost or restarted router is noticed, at once rather than at the next poll: every session
watches its channel's connectivity (`_watch_channel`, a task per session). A router that dies
closes its socket (SIGKILL included), so the channel leaves READY within milliseconds; keepalive
pings notice a peer that went silent without closing anything. Leaving READY marks the session
unreachable and forgets `applied` (a restarted router runs generation 0, or the configuration
file it was started with, never what we pushed to its predecessor), and calls `on_change`, which
wakes the agent: the space's addresses go Configuring in the same pass, naming the router. When
the channel is READY again, `on_change` wakes the agent once more, which pushes.

The backstop: the agent probes every router it believes in sync with a cheap `GetStats` for an
address nobody uses (the answer carries the running generation, not the whole configuration); an
answer below the desired generation makes the agent push again. A router that moved to another
admin port is another `RouterSession` (the directory names it anew).

Errors are answers, not exceptions: a router that refuses (INVALID_ARGUMENT: a bug in the agent's
routes) or cannot be reached is recorded and retried on the next tick; a router that runs a NEWER
generation than pushed (an earlier agent process) reports it in `ahead`, so the space's generation
is moved above it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import grpc
import structlog
from enmasse.common.certificates import TlsFiles
from enmasse.common.credentials import peer_channel
from enmasse.resources.contracts import SYSTEM_PREFIX
from enmasse.resources.discovery import RouterEndpoint
from enmasse.v1 import router_pb2, router_pb2_grpc

log = structlog.get_logger(__name__)

PUSH_DEADLINE = 10.0
PROBE_DEADLINE = 2.0
PROBE_ADDRESS = f"{SYSTEM_PREFIX}enmasse/router-agent/probe"  # never a client address
UNREACHABLE = "unreachable"
SLOW = "slow"
NOT_ANSWERING = (UNREACHABLE, SLOW, "not contacted yet")
MISSES_BEFORE_LOST = 3
# Reconnect soon after a router comes back (gRPC's default back-off grows to two minutes), and
# ping a connection that carries nothing, so that a router that went silent without closing its
# socket is noticed too. The probes (every second) keep data flowing, so a router's default ping
# policy never takes these pings for abuse.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 3_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


class RouterSession:
    def __init__(
        self,
        *,
        space: str,
        endpoint: RouterEndpoint,
        on_change: Callable[[], None] = lambda: None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.space = space
        self.endpoint = endpoint
        self.applied = 0
        self.pushed = 0  # the generation last pushed (answered or not)
        self.ahead = 0  # a generation above ours that the router runs
        self.reachable = False
        self.error = "not contacted yet"
        self.confirmed_at = 0.0  # time.time() of the last answer naming the running generation
        self.peers: list[str] = []
        self._on_change = on_change
        self._channel = peer_channel(endpoint.admin, tls=tls, options=CHANNEL_OPTIONS)
        self._stub = router_pb2_grpc.RouterAdminStub(self._channel)
        self._log = log.bind(space=space, router=endpoint.router_id)
        self._watcher: asyncio.Task[None] | None = None
        self._misses = 0  # deadlines missed in a row

    def watch(self) -> None:
        """Starts following the channel's connectivity (needs a running event loop)."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(
                self._watch_channel(), name=f"channel-{self.space}-{self.endpoint.router_id}"
            )

    async def _watch_channel(self) -> None:
        try:
            state = self._channel.get_state(try_to_connect=True)
            while True:
                await self._channel.wait_for_state_change(state)
                was, state = state, self._channel.get_state(try_to_connect=True)
                if was == grpc.ChannelConnectivity.READY:
                    # it left READY, whatever it says now: its process may be a new one
                    self._lost("connection lost")
                if state == grpc.ChannelConnectivity.READY:
                    self._on_change()  # back: the agent pushes now, not at the next tick
        except Exception:
            # the probes still notice a lost router, a second later
            self._log.exception("watching the router's connection failed")

    def _lost(self, why: str) -> None:
        """The router is gone (or cannot be told apart from gone): forget what it ran. Wakes the
        agent only when this is news: a router that stays down must not spin the agent's loop."""
        news = self.reachable or self.applied
        had = self.applied
        self.reachable = False
        self.applied = 0
        self._misses = 0
        self.error = f"{UNREACHABLE}: {why}"
        if news:
            self._log.warning("router lost", was=had, reason=why)
            self._on_change()

    def _no_answer(self, error: grpc.aio.AioRpcError) -> None:
        """A call that got no answer. A deadline missed now and then is a busy router, not a
        lost one: only MISSES_BEFORE_LOST in a row count as lost; anything else at once."""
        code = error.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and self.reachable:
            self._misses += 1
            if self._misses < MISSES_BEFORE_LOST:
                self.error = f"{SLOW}: no answer within the deadline ({self._misses} in a row)"
                return
        self._lost(f"{code.name} {error.details() or ''}".strip())

    def _confirmed(self, generation: int) -> None:
        self.applied = generation
        self.reachable = True
        self._misses = 0
        self.confirmed_at = time.time()
        if self.error.startswith(NOT_ANSWERING):
            self.error = ""  # it answers again

    async def push(self, config: router_pb2.RouterConfig) -> None:
        self.pushed = config.generation
        try:
            answer = await self._stub.ApplyConfig(config, timeout=PUSH_DEADLINE)
        except grpc.aio.AioRpcError as error:
            await self._refused(error, generation=config.generation)
            return
        self._confirmed(answer.generation)
        self.error = ""
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
            self._no_answer(error)
        if self.error != before:  # once per new problem, not once per pass
            self._log.warning("router did not apply", generation=generation, reason=self.error)

    async def probe(self) -> int | None:
        """The generation the router runs now (None when it does not answer)."""
        try:
            stats = await self._stub.GetStats(
                router_pb2.StatsRequest(address=PROBE_ADDRESS), timeout=PROBE_DEADLINE
            )
        except grpc.aio.AioRpcError as error:
            self._no_answer(error)
            return None
        if stats.generation < self.applied:
            self._log.info(
                "router restarted or lost its configuration",
                running=stats.generation,
                was=self.applied,
            )
        self._confirmed(stats.generation)
        return int(stats.generation)

    async def connections(self) -> router_pb2.ConnectionList | None:
        """The router's connections now (elasticity's load samples); None without an answer."""
        try:
            answer: router_pb2.ConnectionList = await self._stub.ListConnections(
                router_pb2.ListConnectionsRequest(), timeout=PUSH_DEADLINE
            )
        except grpc.aio.AioRpcError:
            return None
        return answer

    async def stats(self, address: str) -> router_pb2.RouterStats | None:
        try:
            answer: router_pb2.RouterStats = await self._stub.GetStats(
                router_pb2.StatsRequest(address=address), timeout=PUSH_DEADLINE
            )
        except grpc.aio.AioRpcError:
            return None
        return answer

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        with contextlib.suppress(Exception):
            await self._channel.close()
