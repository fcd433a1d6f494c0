"""Link-state routing: cheapest paths, reachable consumers, convergence on loss, multicast trees."""

from __future__ import annotations

import pytest
from enmasse.router.mesh import LinkStateDatabase, RouterAdvert


def _mesh(
    viewer: str, links: dict[str, dict[str, int]], consumers: dict[str, set[str]]
) -> LinkStateDatabase:
    """`viewer`'s database after every router advertised `links` and `consumers`."""
    db = LinkStateDatabase(viewer, first_sequence=0)
    for router, neighbors in links.items():
        advert = RouterAdvert(
            router_id=router,
            sequence=1,
            neighbors=neighbors,
            addresses={address: 1 for address in consumers.get(router, set())},
        )
        if router == viewer:
            db.set_local(neighbors=neighbors, addresses=advert.addresses)
        else:
            db.learn(advert)
    return db


SQUARE = {
    "a": {"b": 1, "c": 5},
    "b": {"a": 1, "d": 1},
    "c": {"a": 5, "d": 1},
    "d": {"b": 1, "c": 1},
}


def test_cheapest_path_and_next_hop() -> None:
    db = _mesh("a", SQUARE, {})
    assert db.reachable() == ["b", "c", "d"]
    assert db.next_hop("d") == "b"
    assert db.cost_to("d") == 2
    assert db.next_hop("c") == "b"  # a-b-d-c costs 3, a-c costs 5
    assert db.cost_to("c") == 3


def test_consumers_only_count_when_their_router_is_reachable() -> None:
    db = _mesh("a", SQUARE, {"c": {"calls"}, "d": {"calls"}})
    assert db.routers_with_consumers("calls") == {"c", "d"}
    assert db.routers_with_consumers("other") == frozenset()
    assert db.consumers_at("c", "calls") == 1
    assert db.consumers_at("c", "other") == 0


def test_dead_router_drops_out_when_a_neighbour_reports_the_loss() -> None:
    db = _mesh("a", SQUARE, {"d": {"calls"}})
    assert db.routers_with_consumers("calls") == {"d"}
    # b loses d; c loses d: d's own (stale) advert still claims both links, which no longer count.
    assert db.learn(RouterAdvert(router_id="b", sequence=2, neighbors={"a": 1}))
    assert db.next_hop("d") == "c"
    assert db.learn(RouterAdvert(router_id="c", sequence=2, neighbors={"a": 5}))
    assert db.next_hop("d") is None
    assert "d" not in db.reachable()
    assert db.routers_with_consumers("calls") == frozenset()


def test_older_or_repeated_adverts_are_not_flooded_again() -> None:
    db = _mesh("a", SQUARE, {})
    assert not db.learn(RouterAdvert(router_id="b", sequence=1, neighbors={}))
    assert not db.learn(RouterAdvert(router_id="b", sequence=0, neighbors={}))
    assert not db.learn(RouterAdvert(router_id="a", sequence=99, neighbors={}))


def test_local_advert_changes_only_when_something_changed() -> None:
    db = LinkStateDatabase("a", first_sequence=10)
    first = db.set_local(neighbors={"b": 1}, addresses={"x": 1})
    assert first is not None
    assert first.sequence == 11
    assert db.set_local(neighbors={"b": 1}, addresses={"x": 1}) is None
    second = db.set_local(neighbors={"b": 1}, addresses={"x": 2})  # one more consumer
    assert second is not None
    assert second.sequence == 12


def test_advert_wire_round_trip_and_garbage() -> None:
    advert = RouterAdvert(router_id="a", sequence=7, neighbors={"b": 2}, addresses={"x": 3})
    assert RouterAdvert.decode(advert.encode()) == advert
    with pytest.raises(ValueError, match="malformed router advert"):
        RouterAdvert.decode(b"\x00garbage")
    with pytest.raises(ValueError, match="malformed router advert"):
        RouterAdvert.decode(b'{"router_id": "a"}')


CHAIN_AND_STAR = {
    # a - b - c, and b - d: a copy from a must reach c and d, through b, once each.
    "a": {"b": 1},
    "b": {"a": 1, "c": 1, "d": 1},
    "c": {"b": 1},
    "d": {"b": 1},
}


@pytest.mark.parametrize(
    ("viewer", "expected"),
    [("a", ["b"]), ("b", ["c", "d"]), ("c", []), ("d", [])],
)
def test_multicast_copies_follow_the_tree_rooted_at_the_origin(
    viewer: str, expected: list[str]
) -> None:
    db = _mesh(viewer, CHAIN_AND_STAR, {"c": {"news"}, "d": {"news"}})
    assert db.multicast_next_hops(origin="a", address="news") == expected


def test_multicast_in_a_full_mesh_sends_each_router_one_copy_directly() -> None:
    full = {r: {o: 1 for o in "abc" if o != r} for r in "abc"}
    consumers = {"a": {"news"}, "b": {"news"}, "c": {"news"}}
    assert _mesh("a", full, consumers).multicast_next_hops(origin="a", address="news") == [
        "b",
        "c",
    ]
    assert _mesh("b", full, consumers).multicast_next_hops(origin="a", address="news") == []
