"""What the router's two sides may ask of its forwarding core: the `ForwardingCore` contract.

The core (`forwarding.Router`) owns the address points, the connections and the configuration;
its mesh side (`inter_router.MeshLinks`) and its broker side (`waypoints.BrokerLinks`) read that
state and hand deliveries, credit and lost targets back to it. They see the core through this
Protocol only, so neither imports `forwarding.py` (which imports both): the router's modules form
no circle. What flows in: nothing at run time; a Protocol is a type-checking construct, and a call
through it is the same attribute lookup on the same `Router` object, so the per-message paths of
the sides cost what they did.
"""

from __future__ import annotations

from typing import Protocol

import structlog
from enmasse.amqp.engine import Connection, Delivery, Engine, Link
from enmasse.router.config import RouterConfig
from enmasse.router.mesh import LinkStateDatabase
from enmasse.router.points import AddressPoint, ConnectionRecord, ConnectionRole


class ForwardingCore(Protocol):
    """The forwarding core as its mesh and broker sides see it; everything on the engine thread."""

    router_id: str
    engine: Engine
    idle_timeout: float | None  # for the connections the sides dial
    config: RouterConfig
    mesh: LinkStateDatabase
    points: dict[str, AddressPoint]
    log: structlog.stdlib.BoundLogger

    # ---------------------------------------------------------------- connections

    def open_connection(
        self, conn: Connection, *, role: ConnectionRole
    ) -> ConnectionRecord | None: ...

    def close_record(self, conn: Connection) -> None: ...

    # ---------------------------------------------------------------- address points

    def transit_point(self, address: str) -> AddressPoint: ...

    def first_window(self, messages: int, budget: int) -> int: ...

    def grant_credit(self, point: AddressPoint) -> None: ...

    def drain_pending(self, point: AddressPoint) -> None: ...

    def mesh_changed(self) -> None: ...

    # ---------------------------------------------------------------- deliveries

    def route(
        self, point: AddressPoint, delivery: Delivery, *, local_only: bool = False
    ) -> None: ...

    def release(self, point: AddressPoint | None, delivery: Delivery) -> None: ...

    def target_lost(self, link: Link) -> None: ...
