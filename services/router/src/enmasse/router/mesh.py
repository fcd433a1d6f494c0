"""The mesh as one router sees it: link-state adverts in; next hops and consumers out.

Every router of a space floods a `RouterAdvert` to its neighbours whenever what it offers changes:
its neighbours (with the link cost) and the addresses it has consumers for (with how many, so
that anycast balances over consumers, not over routers). A router keeps the
newest advert of every origin (by sequence number; a restarted router starts from the wall clock in
nanoseconds, so its first advert supersedes whatever its previous life said) and recomputes:

- which routers it can reach, at what cost, and through which neighbour (Dijkstra; an edge counts
  only when BOTH ends advertise it, so a dead router drops out as soon as one of its neighbours
  reports the loss, however stale the dead router's own advert is);
- which reachable routers have consumers for an address (anycast credit and balancing);
- for multicast, the neighbours a copy must go to: the children, in the shortest-path tree rooted at
  the copy's origin router, whose subtree holds a router with consumers. Every router computes the
  same tree from the same adverts (ties broken by router id), so each consumer gets one copy.

Pure: no sockets, no timers. The proton side feeds adverts in and asks questions.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RouterAdvert:
    router_id: str
    sequence: int
    neighbors: Mapping[str, int] = field(default_factory=dict)
    addresses: Mapping[str, int] = field(default_factory=dict)  # address -> local consumers

    def encode(self) -> bytes:
        return json.dumps(
            {
                "router_id": self.router_id,
                "sequence": self.sequence,
                "neighbors": dict(self.neighbors),
                "addresses": dict(sorted(self.addresses.items())),
            },
            separators=(",", ":"),
        ).encode()

    @staticmethod
    def decode(data: bytes) -> RouterAdvert:
        """Raises ValueError on anything that is not a well-formed advert."""
        try:
            raw = json.loads(data)
            neighbors = {str(k): int(v) for k, v in raw["neighbors"].items()}
            return RouterAdvert(
                router_id=str(raw["router_id"]),
                sequence=int(raw["sequence"]),
                neighbors=neighbors,
                addresses={str(a): int(n) for a, n in raw["addresses"].items()},
            )
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as error:
            raise ValueError(f"malformed router advert: {error}") from None


class LinkStateDatabase:
    """The newest advert of every router, and the routes computed from them."""

    def __init__(self, router_id: str, *, first_sequence: int | None = None) -> None:
        self.router_id = router_id
        self._sequence = first_sequence if first_sequence is not None else time.time_ns()
        self._adverts: dict[str, RouterAdvert] = {
            router_id: RouterAdvert(router_id=router_id, sequence=self._sequence)
        }
        self._cost: dict[str, int] = {router_id: 0}
        self._next_hop: dict[str, str] = {}
        self._consumers_at: dict[str, frozenset[str]] = {}

    @property
    def local(self) -> RouterAdvert:
        return self._adverts[self.router_id]

    def adverts(self) -> list[RouterAdvert]:
        return list(self._adverts.values())

    def set_local(
        self, *, neighbors: Mapping[str, int], addresses: Mapping[str, int]
    ) -> RouterAdvert | None:
        """Updates this router's own advert; returns it when it changed (flood it), else None."""
        addresses = dict(addresses)
        current = self.local
        if dict(current.neighbors) == dict(neighbors) and dict(current.addresses) == addresses:
            return None
        self._sequence += 1
        advert = RouterAdvert(
            router_id=self.router_id,
            sequence=self._sequence,
            neighbors=dict(neighbors),
            addresses=addresses,
        )
        self._adverts[self.router_id] = advert
        self._recompute()
        return advert

    def learn(self, advert: RouterAdvert) -> bool:
        """Stores an advert from elsewhere when newer; True when it was (flood it on)."""
        if advert.router_id == self.router_id:
            return False
        known = self._adverts.get(advert.router_id)
        if known is not None and known.sequence >= advert.sequence:
            return False
        self._adverts[advert.router_id] = advert
        self._recompute()
        return True

    def reachable(self) -> list[str]:
        """Routers this one can reach, itself excluded, sorted."""
        return sorted(r for r in self._cost if r != self.router_id)

    def cost_to(self, router_id: str) -> int | None:
        return self._cost.get(router_id)

    def next_hop(self, router_id: str) -> str | None:
        """The neighbour to send through to reach `router_id`; None when unreachable or self."""
        return self._next_hop.get(router_id)

    def routers_with_consumers(self, address: str) -> frozenset[str]:
        """Reachable OTHER routers that advertise consumers for `address`."""
        return self._consumers_at.get(address, frozenset())

    def consumers_at(self, router_id: str, address: str) -> int:
        """How many consumers for `address` the router `router_id` advertised."""
        advert = self._adverts.get(router_id)
        return advert.addresses.get(address, 0) if advert is not None else 0

    def multicast_next_hops(self, *, origin: str, address: str) -> list[str]:
        """Neighbours to send a multicast copy to, for a copy that entered the mesh at `origin`.

        This router sits somewhere in the shortest-path tree rooted at `origin`; a copy goes to each
        child whose subtree holds a router with consumers for the address.
        """
        if origin not in self._adverts:
            return []
        parent = _shortest_path_tree(self._edges(), origin)
        if self.router_id not in parent and self.router_id != origin:
            return []
        wanted = {
            a.router_id
            for a in self._adverts.values()
            if address in a.addresses and (a.router_id in parent or a.router_id == origin)
        }
        hops: set[str] = set()
        for router in wanted:
            child = _child_on_path(parent, ancestor=self.router_id, node=router)
            if child is not None:
                hops.add(child)
        return sorted(hops)

    def _edges(self) -> dict[str, dict[str, int]]:
        """Only links that both ends advertise: a one-sided claim is a dead or stale peer."""
        edges: dict[str, dict[str, int]] = {}
        for advert in self._adverts.values():
            for neighbor, cost in advert.neighbors.items():
                other = self._adverts.get(neighbor)
                if other is not None and advert.router_id in other.neighbors:
                    edges.setdefault(advert.router_id, {})[neighbor] = max(
                        cost, other.neighbors[advert.router_id]
                    )
        return edges

    def _recompute(self) -> None:
        edges = self._edges()
        cost, first_hop = _dijkstra(edges, self.router_id)
        self._cost = cost
        self._next_hop = first_hop
        consumers: dict[str, set[str]] = {}
        for router_id in cost:
            if router_id == self.router_id:
                continue
            for address in self._adverts[router_id].addresses:
                consumers.setdefault(address, set()).add(router_id)
        self._consumers_at = {a: frozenset(r) for a, r in consumers.items()}


def _dijkstra(
    edges: Mapping[str, Mapping[str, int]], source: str
) -> tuple[dict[str, int], dict[str, str]]:
    """Cost to every reachable node and the first hop from `source`; ties go to the smaller id."""
    cost: dict[str, int] = {source: 0}
    first_hop: dict[str, str] = {}
    queue: list[tuple[int, str, str]] = [(0, "", source)]
    done: set[str] = set()
    while queue:
        distance, hop, node = heapq.heappop(queue)
        if node in done:
            continue
        done.add(node)
        if hop:
            first_hop[node] = hop
        for neighbor, weight in sorted(edges.get(node, {}).items()):
            candidate = distance + weight
            if neighbor not in done and candidate <= cost.get(neighbor, candidate):
                cost[neighbor] = candidate
                heapq.heappush(queue, (candidate, hop or neighbor, neighbor))
    return {n: c for n, c in cost.items() if n in done}, first_hop


def _shortest_path_tree(edges: Mapping[str, Mapping[str, int]], root: str) -> dict[str, str]:
    """Parent of every node reachable from `root` (root excluded), deterministic on ties."""
    parent: dict[str, str] = {}
    queue: list[tuple[int, str, str]] = [(0, "", root)]
    done: set[str] = set()
    while queue:
        distance, via, node = heapq.heappop(queue)
        if node in done:
            continue
        done.add(node)
        if via:
            parent[node] = via
        for neighbor, weight in sorted(edges.get(node, {}).items()):
            if neighbor not in done:
                heapq.heappush(queue, (distance + weight, node, neighbor))
    return parent


def _child_on_path(parent: Mapping[str, str], *, ancestor: str, node: str) -> str | None:
    """The child of `ancestor` on the tree path down to `node`; None when `node` is not below it."""
    while node in parent:
        up = parent[node]
        if up == ancestor:
            return node
        node = up
    return None
