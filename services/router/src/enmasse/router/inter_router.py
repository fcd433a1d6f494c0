"""The router's side of the mesh: connections to the other routers of its space.

What flows in: the configuration's peers (each pair of routers connects once: the greater
router id dials the smaller, over mutual TLS with its certificate when it has one, logging in
with its router id and the space's mesh secret when it has one; the listener has already checked
the certificate and the secret, here the peer must open with the id it logged in as),
inter-router connections and their links, adverts from neighbours,
and deliveries that neighbours route to or through this router. What flows out: this router's
advert, flooded to every neighbour whenever its neighbours or the addresses it has consumers for
change (and every advert learnt, flooded on), the link-state database kept current (which the
core asks for next hops and reachable consumers), and links towards neighbours that carry
deliveries: `_mesh/to/<router>/<address>` for anycast (passed on hop by hop towards `<router>`)
and `_mesh/mc/<origin>/<address>` for multicast copies.

Why links named after their destination: a delivery on `_mesh/to/r3/orders` needs no header
rewrite and no per-message lookup of where it is going; the receiving router reads the link's
address once, at attach. A lost neighbour (its connection closed or reset, as when its process is
killed) is dropped from this router's advert at once, and the routers that hear of it recompute
their routes: the mesh converges in the time the adverts take to cross it. A peer turned away
before it became a neighbour (no certificate, one of another CA, plain TCP on the TLS port, a
wrong secret), on either side, is logged as a warning naming it and the reason: a refusal does
not heal by redialling, somebody has to look (once a minute per peer and reason: the refused
router redials every second).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from enmasse.amqp import codec
from enmasse.amqp.engine import Condition, Connection, ConnectionHandler, Delivery, Link, Tls
from enmasse.amqp.throttle import peer_host
from enmasse.router.access import MeshSecret, is_router_id
from enmasse.router.config import MeshPeer
from enmasse.router.core import ForwardingCore
from enmasse.router.fanout import CopyQueue
from enmasse.router.mesh import RouterAdvert
from enmasse.router.points import (
    ANYCAST,
    CONTROL_IN,
    CONTROL_OUT,
    CONTROL_WINDOW,
    MESH_CONTROL,
    MESH_TO,
    MULTICAST,
    MULTICAST_IN,
    MULTICAST_OUT,
    REDIAL_SECONDS,
    TRANSIT_BYTES,
    TRANSIT_IN,
    TRANSIT_OUT,
    TRANSIT_WINDOW,
    UNREACHABLE,
    AddressPoint,
    ConnectionRole,
    LinkState,
    Role,
    mesh_target,
)
from enmasse.router.windows import refill

REFUSAL_QUIET_SECONDS = 60.0  # a refusal logged is not logged again for that peer so soon
REFUSALS_REMEMBERED = 1024


@dataclass(eq=False)
class Neighbor:
    router_id: str
    connection: Connection
    cost: int
    control: Link | None = None
    backlog: deque[bytes] = field(default_factory=deque)
    senders: dict[str, Link] = field(default_factory=dict)  # target address -> our link


class MeshLinks:
    """Connections and links to the other routers of the mesh, for one router (its forwarding
    core seen through `core.ForwardingCore`)."""

    def __init__(
        self, router: ForwardingCore, *, handler_for_peer: Callable[[str], ConnectionHandler]
    ) -> None:
        self.router = router
        # The engine handler of a connection we dial to the router of that id (`handlers.py`,
        # wired by main): passed in, so this module need not import the handlers that wrap it.
        self._handler_for_peer = handler_for_peer
        self.neighbors: dict[str, Neighbor] = {}
        self._dialing: dict[str, int] = {}  # peer router id -> attempts so far
        # The space's shared secret (set by main before the engine runs); None: an open mesh.
        self.secret: MeshSecret | None = None
        # This router's certificate and the CA its peers' must chain to (set by main, as the
        # listener's); None: plain TCP.
        self.tls: Tls | None = None
        self._told: dict[tuple[str, str], float] = {}  # (peer, reason) -> when it was logged

    def sync_peers(self) -> None:
        wanted = {p.router_id: p for p in self.router.config.peers}
        for router_id, neighbor in list(self.neighbors.items()):
            if router_id not in wanted:
                neighbor.connection.close(
                    Condition("amqp:connection:forced", f"router '{router_id}' left the mesh")
                )
        for peer in self.router.config.peers_to_dial(router_id=self.router.router_id):
            if peer.router_id not in self.neighbors and peer.router_id not in self._dialing:
                self._dial_peer(peer)

    def _dial_peer(self, peer: MeshPeer) -> None:
        current = {p.router_id: p for p in self.router.config.peers}.get(peer.router_id)
        if current is None or peer.router_id in self.neighbors:
            self._dialing.pop(peer.router_id, None)
            return
        self._dialing[peer.router_id] = self._dialing.get(peer.router_id, 0)
        self.router.engine.connect(
            host=current.host,
            port=current.port,
            handler=self._handler_for_peer(current.router_id),
            container_id=self.router.router_id,
            idle_timeout=self.router.idle_timeout,
            user=self.router.router_id if self.secret is not None else None,
            password=self.secret.value if self.secret is not None else None,
            tls=self.tls,
        )

    def neighbor_open(self, conn: Connection, *, peer_id: str | None) -> None:
        if not peer_id or not is_router_id(peer_id) or peer_id == self.router.router_id:
            refusal = Condition("amqp:unauthorized-access", f"'{peer_id}' is not a router id")
            self._turn_away(conn, refusal)
            return
        if self.secret is not None and conn.incoming and conn.user != peer_id:
            # The secret proves "a router of this space"; which one is the id it logged in as.
            refusal = Condition(
                "amqp:unauthorized-access",
                f"logged in as router '{conn.user}' but opened as '{peer_id}'",
            )
            self._turn_away(conn, refusal)
            return
        if peer_id in self.neighbors:
            refusal = Condition("amqp:resource-locked", f"router '{peer_id}' is already connected")
            self._turn_away(conn, refusal)
            return
        self._dialing.pop(peer_id, None)
        self.router.open_connection(conn, role=ConnectionRole.INTER_ROUTER)
        cost = next((p.cost for p in self.router.config.peers if p.router_id == peer_id), 1)
        neighbor = Neighbor(router_id=peer_id, connection=conn, cost=cost)
        self.neighbors[peer_id] = neighbor
        control = conn.open_sender(
            MESH_CONTROL, name=f"{self.router.router_id}/control", settled=True
        )
        control.context = LinkState(role=CONTROL_OUT, router=peer_id)
        neighbor.control = control
        for advert in self.router.mesh.adverts():
            neighbor.backlog.append(advert.encode())
        self.router.log.info("router connected", peer=peer_id)
        self.advertise()
        self.router.mesh_changed()

    def neighbor_closed(
        self, conn: Connection, *, expected: str | None, error: Condition | None = None
    ) -> None:
        self.router.close_record(conn)
        gone = next((n for n in self.neighbors.values() if n.connection is conn), None)
        if gone is None and error is not None:
            self._refused(conn, expected=expected, error=error)
        if gone is not None:
            del self.neighbors[gone.router_id]
            self.router.log.warning("router connection lost", peer=gone.router_id)
            self.advertise()
            self.router.mesh_changed()
        if expected is not None:
            peer = next((p for p in self.router.config.peers if p.router_id == expected), None)
            if peer is not None and expected not in self.neighbors:
                attempt = self._dialing.get(expected, 0)
                self._dialing[expected] = attempt + 1
                delay = REDIAL_SECONDS[min(attempt, len(REDIAL_SECONDS) - 1)]
                self.router.engine.call_later(delay, lambda: self._dial_peer(peer))
            else:
                self._dialing.pop(expected, None)

    def _turn_away(self, conn: Connection, refusal: Condition) -> None:
        self._refused(conn, expected=conn.container_id, error=refusal)
        conn.close(refusal)

    def _refused(self, conn: Connection, *, expected: str | None, error: Condition) -> None:
        """A connection ended before it made a neighbour: says who and why, unless the peer was
        merely unreachable (it is down or starting: redialling heals that)."""
        if error.name == UNREACHABLE or not self._worth_telling(
            expected or peer_host(conn.peer), error.description
        ):
            return
        who = {"peer": expected or conn.peer, "address": conn.peer}
        if conn.incoming and conn.user:
            who["user"] = conn.user
        if error.name == "amqp:unauthorized-access":
            # Wrong or missing mesh secret, or a wrong identity, on one side.
            self.router.log.warning("inter-router login refused", **who, error=error.description)
        else:  # TLS: no certificate, one of another CA, plain TCP on the TLS port, ...
            self.router.log.warning(
                "inter-router connection refused",
                **who,
                condition=error.name,
                error=error.description,
            )

    def _worth_telling(self, who: str, why: str) -> bool:
        """Once a minute per peer and reason: a refused router redials every second."""
        now = time.monotonic()
        if now - self._told.get((who, why), -REFUSAL_QUIET_SECONDS) < REFUSAL_QUIET_SECONDS:
            return False
        if len(self._told) >= REFUSALS_REMEMBERED:
            self._told.clear()  # a scan from many hosts must not grow the table without bound
        self._told[(who, why)] = now
        return True

    def attach(self, link: Link) -> None:
        """A neighbour attached a link to us: control, anycast transit or multicast."""
        neighbor = self._neighbor_of(link.connection)
        address = link.address or ""
        if neighbor is None or link.is_sender:
            link.refuse(Condition("amqp:not-allowed", "inter-router links carry messages to us"))
            return
        if address == MESH_CONTROL:
            link.context = LinkState(role=CONTROL_IN, router=neighbor.router_id)
            link.accept()
            link.flow(CONTROL_WINDOW)
            return
        router, target = mesh_target(address)
        if router and target:
            role = TRANSIT_IN if address.startswith(MESH_TO) else MULTICAST_IN
            window = self.router.first_window(TRANSIT_WINDOW, TRANSIT_BYTES)
            link.context = LinkState(role=role, router=router, window=window)
            self.bind(link, link.context)
            link.accept()
            link.flow(window)
            return
        link.refuse(Condition("amqp:not-found", f"no inter-router address '{address}'"))

    def bind(self, link: Link, state: LinkState) -> AddressPoint:
        """Binds a neighbour's link to the point of the address it is named after."""
        point = self.router.transit_point(mesh_target(link.address or "")[1])
        state.point = point
        if state.role is TRANSIT_IN and state.router == self.router.router_id:
            point.transit_in.append(link)
        return point

    def unbind(self, retired: AddressPoint) -> None:
        """An address point was retired (its address deleted, or its type changed): the
        neighbours' links that delivered to it are bound afresh by what they send next
        (`bind`), to the address's point of that moment.

        Their links outlive the point: they are named after the address, not after a
        configuration, so a neighbour goes on sending on them once the address is back."""
        for neighbor in self.neighbors.values():
            for link in neighbor.connection.links:
                state = link.context
                if (
                    isinstance(state, LinkState)
                    and state.point is retired
                    and (state.role is TRANSIT_IN or state.role is MULTICAST_IN)
                ):
                    state.point = None

    def link_detached(self, link: Link) -> None:
        state = link.context
        if not isinstance(state, LinkState):
            return
        if state.role is TRANSIT_IN and state.point is not None:
            if link in state.point.transit_in:
                state.point.transit_in.remove(link)
            return
        if state.role in (TRANSIT_OUT, MULTICAST_OUT):
            neighbor = self._neighbor_of(link.connection)
            if neighbor is not None:
                neighbor.senders.pop(link.address or "", None)
            point = state.point
            if point is not None:
                point.targets.remove(link)
                for router, remote in list(point.remote.items()):
                    if remote is link:
                        del point.remote[router]
            self.router.target_lost(link)

    def _neighbor_of(self, conn: Connection) -> Neighbor | None:
        return next((n for n in self.neighbors.values() if n.connection is conn), None)

    def sender_towards(self, router_id: str, address: str, *, role: Role) -> Link | None:
        neighbor = self.neighbors.get(router_id)
        if neighbor is None:
            return None
        link = neighbor.senders.get(address)
        if link is None or not link.is_open:
            link = neighbor.connection.open_sender(
                address, name=f"{self.router.router_id}/{address}"
            )
            point = self.router.points.get(mesh_target(address)[1])
            link.context = LinkState(
                role=role,
                point=point,
                router=router_id,
                copies=CopyQueue() if role is MULTICAST_OUT else None,
            )
            neighbor.senders[address] = link
        return link

    def from_transit(self, link: Link, state: LinkState, delivery: Delivery) -> None:
        point = state.point
        if point is None:
            point = self.bind(link, state)
        point.counters.deliveries_in += 1
        if state.router == self.router.router_id:
            if point.local:
                self.router.route(point, delivery, local_only=True)
            else:
                self.router.release(point, delivery)
            self._give_back(link, state, len(delivery.payload), onward=None)
            return
        hop = self.router.mesh.next_hop(state.router)
        onward = self.sender_towards(hop, link.address or "", role=TRANSIT_OUT) if hop else None
        if onward is None:
            self.router.release(point, delivery)
            link.flow(1)
            return
        if delivery.pre_settled:
            onward.send_settled(delivery.payload)
        else:
            onward.send(delivery.payload, context=delivery)
        onward.connection.context.deliveries_out += 1
        self._give_back(link, state, len(delivery.payload), onward=onward)

    @staticmethod
    def _give_back(link: Link, state: LinkState, size: int, *, onward: Link | None) -> None:
        """Gives a neighbour its credit back in quarter windows, as what it sent moves on: here,
        while nothing waits for a local consumer (`Router.grant_credit` gives the rest when the
        address's pending queue empties); passing through, while the link onward has credit
        (`release_held_back` when it gets some). So what a stalled consumer leaves waiting is
        bounded by the windows all the way back to its producers."""
        state.unflowed += 1
        state.unflowed_bytes += size
        if state.unflowed < state.window // 4:
            return
        if onward is None:
            point = state.point
            if point is not None and point.pending:
                return
        elif onward.credit <= 0:
            held = onward.context.held_back
            if link not in held:
                held.append(link)
            return
        refill(link, state)

    @staticmethod
    def release_held_back(onward: Link) -> None:
        """A link towards a neighbour got credit: the transit links held back for it get theirs."""
        held = onward.context.held_back
        while held:
            link = held.pop()
            if link.is_open and isinstance(link.context, LinkState):
                refill(link, link.context)

    def from_control(self, link: Link, state: LinkState, delivery: Delivery) -> None:
        link.flow(1)
        try:
            body = codec.read_body(delivery.payload)
            advert = RouterAdvert.decode(body if isinstance(body, bytes) else str(body).encode())
        except (ValueError, codec.CodecError) as error:
            self.router.log.warning("bad advert", peer=state.router, error=str(error))
            return
        if self.router.mesh.learn(advert):
            self._flood(advert, skip=state.router)
            self.router.mesh_changed()

    def advertise(self) -> None:
        addresses = {
            p.address: len(p.local)
            for p in self.router.points.values()
            if p.local and p.kind in (ANYCAST, MULTICAST)
        }
        neighbors = {n.router_id: n.cost for n in self.neighbors.values()}
        advert = self.router.mesh.set_local(neighbors=neighbors, addresses=addresses)
        if advert is not None:
            self._flood(advert, skip=None)
            self.router.mesh_changed()

    def _flood(self, advert: RouterAdvert, *, skip: str | None) -> None:
        encoded = advert.encode()
        for neighbor in self.neighbors.values():
            if neighbor.router_id != skip:
                neighbor.backlog.append(encoded)
                self.flush_control(neighbor.router_id)

    def flush_control(self, router_id: str) -> None:
        neighbor = self.neighbors.get(router_id)
        if neighbor is None or neighbor.control is None:
            return
        control = neighbor.control
        while neighbor.backlog and control.credit > 0:
            control.send(codec.encode_message(neighbor.backlog.popleft()), settled=True)
