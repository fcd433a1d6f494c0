"""The console's pure part: views of the API's answers, forms to resources, refusals to fields,
watch events to server-sent events. No network: the inputs are the API's own messages, and the
refusal texts are made by the validation library's `Violation`, as the config service makes them;
the live figures from routers' and brokers' answers."""

from __future__ import annotations

import json

from enmasse.console.figures import Sample, figures
from enmasse.console.forms import (
    ADDRESS_FIELDS,
    FORM,
    USER_FIELDS,
    AddressForm,
    UserForm,
    field_errors,
)
from enmasse.console.live import figures_frame, frame_of, refusal_frame
from enmasse.console.views import (
    address_types,
    address_view,
    plan_choices,
    space_views,
    user_view,
)
from enmasse.resources.address_figures import Counts, brokered_counts, standard_counts
from enmasse.resources.validation import Violation
from enmasse.v1 import broker_pb2, config_pb2, resources_pb2, router_pb2


def _space(name: str, *, phase: str = "", endpoints: int = 0) -> resources_pb2.AddressSpace:
    return resources_pb2.AddressSpace(
        metadata=resources_pb2.Metadata(name=name),
        spec=resources_pb2.AddressSpaceSpec(type="standard", plan="standard-small"),
        status=resources_pb2.AddressSpaceStatus(
            status=resources_pb2.Status(phase=phase, messages=["2 routers ready"] if phase else []),
            endpoints=[
                resources_pb2.Endpoint(name="amqp", host="127.0.0.1", port=5672 + i)
                for i in range(endpoints)
            ],
        ),
    )


def _address(name: str = "orders", *, phase: str = "Active") -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata=resources_pb2.Metadata(name=name, space="shop", resource_version=42),
        spec=resources_pb2.AddressSpec(address=name, type="queue", plan="standard-small-queue"),
        status=resources_pb2.AddressStatus(
            status=resources_pb2.Status(phase=phase, messages=["placed on broker-0"]),
            brokers=[
                resources_pb2.BrokerPlacement(broker="broker-0", state="Active"),
                resources_pb2.BrokerPlacement(
                    broker="broker-1", state="Active", waiting=True, reason="broker starting"
                ),
            ],
            dead_lettered=3,
            dead_letters_held=1,
        ),
    )


def test_spaces_are_sorted_with_phase_why_and_endpoint_urls() -> None:
    views = space_views([_space("zoo"), _space("shop", phase="Active", endpoints=2)])
    assert [v.name for v in views] == ["shop", "zoo"]
    shop, zoo = views
    assert (shop.phase, shop.why) == ("Active", ("2 routers ready",))
    assert [e.url for e in shop.endpoints] == ["amqp://127.0.0.1:5672", "amqp://127.0.0.1:5673"]
    assert (zoo.phase, zoo.endpoints) == ("Pending", ())  # no status written yet


def test_an_address_view_carries_phase_why_placements_and_dead_letters() -> None:
    view = address_view(_address())
    assert (view.phase, view.why) == ("Active", ("placed on broker-0",))
    assert view.brokers == ("broker-0 Active", "broker-1 waiting: broker starting")
    assert (view.dead_lettered, view.dead_letters_held, view.resource_version) == (3, 1, 42)
    assert view.as_json()["why"] == ["placed on broker-0"]


def test_plan_choices_follow_the_space_plan() -> None:
    space_plan = resources_pb2.AddressSpacePlan(
        spec=resources_pb2.AddressSpacePlanSpec(address_plans=["small-queue", "anycast", "gone"])
    )
    plans = [
        resources_pb2.AddressPlan(
            metadata=resources_pb2.Metadata(name=name),
            spec=resources_pb2.AddressPlanSpec(address_type=kind),
        )
        for name, kind in [("anycast", "anycast"), ("small-queue", "queue"), ("other", "topic")]
    ]
    choices = plan_choices(space_plan=space_plan, address_plans=plans)
    assert [c.label for c in choices] == ["small-queue (queue)", "anycast (anycast)"]
    assert address_types(choices) == ["queue", "anycast"]
    # The space plan unreadable: every plan, the API decides.
    assert len(plan_choices(space_plan=None, address_plans=plans)) == 3


def test_an_address_form_becomes_the_address_and_back() -> None:
    form = AddressForm.from_fields(
        {"name": " orders ", "address": "", "type": "queue", "plan": "p", "resource_version": "7"}
    )
    address = form.to_address(space="shop")
    assert (address.metadata.name, address.metadata.space) == ("orders", "shop")
    assert address.spec.address == "orders"  # defaults to the name
    assert (address.spec.type, address.spec.plan, address.metadata.resource_version) == (
        "queue",
        "p",
        7,
    )
    assert AddressForm.from_address(address) == form


def test_a_user_form_reads_one_rule_a_line() -> None:
    form = UserForm.from_fields(
        {"name": "app", "password": "s3cret", "authorization": "send, recv: orders/#, q\n\nview: #"}
    )
    user = form.to_user(space="shop")
    assert (user.spec.username, user.spec.password) == ("app", "s3cret")
    rules = [(list(r.operations), list(r.addresses)) for r in user.spec.authorization]
    assert rules == [(["send", "recv"], ["orders/#", "q"]), (["view"], ["#"])]
    assert user_view(user).rules == ("send, recv: orders/#, q", "view: #")
    assert UserForm.from_user(user).rules == "send, recv: orders/#, q\nview: #"
    broken = UserForm.from_fields({"name": "app", "authorization": "send orders"})
    assert "line 1" in broken.problems["authorization"]


def test_a_refusal_lands_beside_the_field_it_names() -> None:
    message = "; ".join(
        str(v)
        for v in [
            Violation("Address", "shop", "bad", "spec.address", "'a..b' has an empty segment"),
            Violation("Address", "shop", "bad", "spec.plan", "address plan 'x' not found"),
        ]
    )
    assert field_errors(message, fields=ADDRESS_FIELDS) == {
        "address": "'a..b' has an empty segment",
        "plan": "address plan 'x' not found",
    }


def test_a_nested_field_path_finds_its_form_field_and_the_rest_is_the_forms() -> None:
    nested = str(
        Violation("MessagingUser", "shop", "app", "spec.authorization[0].operations[1]", "bad op")
    )
    assert field_errors(nested, fields=USER_FIELDS) == {"authorization": "bad op"}
    quota = str(Violation("Address", "shop", "q", "spec.quotas.max_addresses", "too many"))
    assert field_errors(quota, fields=ADDRESS_FIELDS) == {FORM: quota}
    denied = "tenant 'acme' may not write in address space 'other'"
    assert field_errors(denied, fields=ADDRESS_FIELDS) == {FORM: denied}


def _event(
    kind: config_pb2.WatchEvent.Type, address: resources_pb2.Address
) -> config_pb2.WatchEvent:
    return config_pb2.WatchEvent(
        type=kind, object=resources_pb2.Resource(address=address), revision=9
    )


def _parse(frame: str | None) -> tuple[str, object]:
    assert frame is not None
    assert frame.endswith("\n\n")
    event_line, data_line = frame.strip().split("\n")
    return event_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))


def test_watch_events_become_server_sent_events() -> None:
    name, data = _parse(frame_of(_event(config_pb2.WatchEvent.MODIFIED, _address())))
    assert name == "address"
    assert isinstance(data, dict)
    assert (data["name"], data["phase"]) == ("orders", "Active")
    assert data["brokers"] == ["broker-0 Active", "broker-1 waiting: broker starting"]
    deleted = _event(config_pb2.WatchEvent.DELETED, _address())
    assert _parse(frame_of(deleted)) == ("removed", {"name": "orders"})
    synced = config_pb2.WatchEvent(type=config_pb2.WatchEvent.SYNCED, revision=9)
    assert _parse(frame_of(synced)) == ("synced", {"revision": 9})
    assert frame_of(config_pb2.WatchEvent(type=config_pb2.WatchEvent.PROGRESS, revision=9)) is None
    assert _parse(refusal_frame("gone")) == ("failed", {"message": "gone"})


def _router(*stats: tuple[str, int, int, int, int]) -> router_pb2.RouterStats:
    return router_pb2.RouterStats(
        addresses=[
            router_pb2.AddressStats(
                address=a, deliveries_in=i, deliveries_out=o, consumers=c, producers=p
            )
            for a, i, o, c, p in stats
        ]
    )


def _broker(*held: tuple[str, str, int, int]) -> broker_pb2.ListAddressesResponse:
    return broker_pb2.ListAddressesResponse(
        addresses=[
            broker_pb2.BrokerAddress(
                name=n, kind=k, depth=d, in_flight=f, enqueued=d + f + 7, dequeued=7, consumers=2
            )
            for n, k, d, f in held
        ]
    )


def test_a_standard_spaces_figures_sum_its_routers_and_take_stored_from_its_brokers() -> None:
    counts = standard_counts(
        routers=[_router(("orders", 10, 4, 1, 1)), _router(("orders", 5, 0, 0, 2))],
        brokers=[
            _broker(("orders", "queue", 6, 1), ("prices", "topic", 3, 0)),
            _broker(("orders", "queue", 2, 0), ("prices::audit", "subscription", 3, 0)),
        ],
    )
    # Stored: ready and delivered-but-unsettled, over both brokers (6 + 1 + 2).
    assert counts["orders"] == Counts(
        deliveries_in=15, deliveries_out=4, stored=9, consumers=1, producers=3
    )
    # Held on a broker, no router traffic yet; a subscription by its own address string.
    assert counts["prices"] == Counts(stored=3)
    assert counts["audit"] == Counts(stored=3)
    assert "prices::audit" not in counts


def test_a_brokered_spaces_figures_are_its_brokers() -> None:
    counts = brokered_counts(brokers=[_broker(("invoices", "queue", 4, 1))])
    assert counts == {
        "invoices": Counts(
            deliveries_in=12, deliveries_out=7, stored=5, consumers=2, producers=None
        )
    }


def test_rates_come_from_two_samples_and_never_go_negative() -> None:
    first = Sample(at=100.0, counts={"orders": Counts(deliveries_in=10, deliveries_out=4)})
    second = Sample(
        at=102.0,
        counts={"orders": Counts(deliveries_in=30, deliveries_out=2, stored=20, consumers=1)},
    )
    (only,) = figures(previous=None, current=first)
    assert (only["in_per_second"], only["messages_in"]) == (None, 10)
    (moved,) = figures(previous=first, current=second)
    assert moved == {
        "address": "orders",
        "in_per_second": 10.0,
        "out_per_second": None,  # the counter went down: a restart, no rate
        "messages_in": 30,
        "messages_out": 2,
        "stored": 20,
        "consumers": 1,
        "producers": 0,
    }
    frame = figures_frame([moved], silent=("router-1",))
    assert _parse(frame) == ("figures", {"figures": [moved], "silent": ["router-1"]})
