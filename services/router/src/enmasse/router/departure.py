"""A router leaving its space: its clients moved to another router, nothing in flight lost.

What flows in: SIGTERM (main hands it to the engine thread: `Departure.begin`), the router's
client connections (`Router.connections`, role NORMAL) and where its mesh peers serve clients
(`RouterConfig.peers`: the router-agent renders each peer's `amqp_port`). What flows out: each
client connection closed with `amqp:connection:redirect`, its info naming a reachable peer's
`network-host` and `port` (AMQP 1.0 §2.8.15; Qpid clients follow it, and `enmasse send` /
`receive` go on through their endpoint list), or `amqp:connection:forced` when no peer is known;
then the engine stops.

Why so: a space's routers are scaled down by stopping one (the runtime, or Kubernetes, sends it
SIGTERM), and that must move clients without disruption (#18). So a connection is closed only
at a moment when none of its links has a delivery in flight: every delivery it sent us has its
outcome back with it, every one we sent it is settled. The close then lands between two
deliveries, and a producer that follows the redirect sends nothing twice. To bring such a moment
about, a producer's credit is no longer given back once it leaves (it sends what credit it holds,
and its outcomes come back). New connections are refused from the start (the client listeners
close; a client's next endpoint answers instead), while the mesh and the broker links stay up
until the end so what is on its way finishes. A connection still busy at the deadline
(`--leave-timeout`) is closed then anyway: what it had in flight is what a crash would have
left (released to the broker or to another consumer; a producer's failover sends it again).

Nothing here runs per message: the producers' windows are set once, and a timer looks at the
remaining client connections every `CHECK_SECONDS` while the router leaves.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

import structlog
from enmasse.amqp.engine import Condition, Connection, Engine
from enmasse.router.forwarding import Router
from enmasse.router.points import PRODUCER, REVOKED, ConnectionRole, LinkState

log = structlog.get_logger("enmasse.router")

REDIRECT = "amqp:connection:redirect"
FORCED = "amqp:connection:forced"
CHECK_SECONDS = 0.02
# A producer window no top-up ever reaches (`Router._top_up` gives credit back at half the
# window): once its link holds this, the producer's credit is not given back again.
NO_MORE_CREDIT = sys.maxsize


def redirect_condition(*, router_id: str, host: str, port: int) -> Condition:
    """Where a client of a leaving router goes on (the info fields AMQP 1.0 §2.8.15 names)."""
    return Condition(
        REDIRECT,
        f"router {router_id} is leaving the space: go on at {host}:{port}",
        (("network-host", host), ("port", port)),
    )


def leaving_condition(router_id: str) -> Condition:
    return Condition(FORCED, f"router {router_id} is leaving the space")


def in_flight(conn: Connection) -> int:
    """Deliveries on the connection's links, either way, that are not settled yet: a
    producer's whose outcome has not come back, a consumer's it has not settled."""
    return sum(link.in_flight for link in conn.links)


def _close(conn: Connection, condition: Condition) -> None:
    """Closes a client connection so that nothing it sent after our last look is forwarded: a
    transfer already on the wire arrives after the close, and the producer, told its connection
    is gone, sends that message again elsewhere. Its producer links are therefore marked REVOKED
    first, which refuses such a late delivery here (the refusal reaches no one) instead of
    routing it a second time."""
    for link in conn.links:
        state = link.context
        if isinstance(state, LinkState) and state.role is PRODUCER:
            state.role = REVOKED
    conn.close(condition)


class Departure:
    """One router's leaving, from `begin` until the engine stops."""

    def __init__(
        self,
        *,
        router: Router,
        engine: Engine,
        client_ports: Sequence[int],
        timeout: float,
        stop: Callable[[], None] | None = None,
    ) -> None:
        self.router = router
        self.engine = engine
        self.client_ports = tuple(client_ports)
        self.timeout = timeout
        self._stop = stop or engine.stop
        self._deadline = 0.0
        self.started = False
        self.closed_idle = 0  # connections closed between deliveries
        self.closed_busy = 0  # connections still busy at the deadline

    def begin(self) -> None:
        """Starts leaving (on the engine thread; a second SIGTERM changes nothing)."""
        if self.started:
            return
        self.started = True
        self._deadline = time.monotonic() + self.timeout
        for port in self.client_ports:
            self.engine.stop_listening(port)
        clients = self._clients()
        for conn in clients:
            for link in conn.links:
                state = link.context
                if isinstance(state, LinkState) and state.role is PRODUCER:
                    state.window = NO_MORE_CREDIT
        log.info(
            "router leaving",
            router=self.router.router_id,
            clients=len(clients),
            redirect=str(self.condition()),
        )
        self._check()

    def condition(self) -> Condition:
        """A redirect to the first reachable peer that serves clients, else a plain close."""
        reachable = set(self.router.mesh.reachable())
        for peer in sorted(self.router.config.peers, key=lambda p: p.router_id):
            if peer.router_id in reachable and peer.amqp_port:
                return redirect_condition(
                    router_id=self.router.router_id, host=peer.host, port=peer.amqp_port
                )
        return leaving_condition(self.router.router_id)

    def _clients(self) -> list[Connection]:
        return [
            record.connection
            for record in self.router.connections.values()
            if record.role is ConnectionRole.NORMAL
        ]

    def _check(self) -> None:
        overdue = time.monotonic() >= self._deadline
        condition = self.condition()
        for conn in self._clients():
            if in_flight(conn) == 0:
                self.closed_idle += 1
            elif overdue:
                self.closed_busy += 1
            else:
                continue
            _close(conn, condition)
            self.router.close_record(conn)
        if self._clients():
            self.engine.call_later(CHECK_SECONDS, self._check)
            return
        log.info(
            "router left",
            router=self.router.router_id,
            closed_between_deliveries=self.closed_idle,
            closed_at_deadline=self.closed_busy,
        )
        # A turn for the close frames to be written before the engine stops.
        self.engine.call_later(CHECK_SECONDS, self._stop)
