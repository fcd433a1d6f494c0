"""The address catalog as a snapshot plus an append-only log: what a restarted broker finds.

- Domain (no network): every kind of change survives a restart; a torn or corrupt log tail is cut
  and what came before it kept, and later appends land after the cut; compaction keeps the state
  and bounds the log, even when a crash leaves the old log beside the new snapshot; a data
  directory of the older whole-file format still loads; changes buffered without commit are not
  on disk yet and the next commit writes them all.
- Process: 2,000 EnsureQueue calls, 32 in flight at a time, then SIGKILL right after the last
  answer, then a restart: all 2,000 queues are there, with their plans.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
from enmasse.broker.broker import Broker
from enmasse.broker.catalog import COMPACT_SLACK, Catalog, encode_record
from enmasse.broker.plan import Plan
from enmasse.v1 import broker_pb2, resources_pb2

from tests.fixtures.broker import BrokerFactory

IN_FLIGHT = 32


def started(data_dir: Path) -> Broker:
    broker = Broker(data_dir=data_dir)
    broker.start()
    return broker


def restarted(broker: Broker, data_dir: Path) -> Broker:
    broker.close()
    return started(data_dir)


def test_every_kind_of_change_survives_a_restart(tmp_path: Path) -> None:
    broker = started(tmp_path)
    broker.ensure_queue("orders", Plan(max_delivery_attempts=3))
    broker.ensure_queue("gone", Plan())
    broker.ensure_queue("orders", Plan(max_delivery_attempts=5))  # a new plan
    broker.delete_queue("gone")
    broker.ensure_topic("prices", Plan(default_ttl_ms=1000))
    broker.subscribe("prices", identity="app-1", durable=True)
    broker.subscribe("prices", identity="app-2", durable=True)
    broker.subscribe("prices", identity="passing", durable=False)
    broker.unsubscribe("prices", "app-2")
    broker.ensure_topic("news", Plan())
    broker.subscribe("news", identity="reader", durable=True)
    broker.delete_topic("news")

    again = restarted(broker, tmp_path)

    assert {n: q.plan for n, q in again.queues.items()} == {"orders": Plan(max_delivery_attempts=5)}
    assert list(again.topics) == ["prices"]
    assert again.topics["prices"].plan == Plan(default_ttl_ms=1000)
    assert sorted(again.topics["prices"].subscriptions) == ["app-1"]


def test_a_torn_log_tail_is_cut_and_what_came_before_is_kept(tmp_path: Path) -> None:
    broker = started(tmp_path)
    for n in range(10):
        broker.ensure_queue(f"q{n}", Plan())
    broker.close()
    log_path = tmp_path / "addresses.log"
    whole = log_path.read_bytes()
    torn = encode_record({"op": "queue", "name": "half", "plan": Plan().to_dict()})[:-7]
    log_path.write_bytes(whole + torn)  # a crash in the middle of an append

    again = started(tmp_path)

    assert sorted(again.queues) == sorted(f"q{n}" for n in range(10))
    assert again._catalog.torn_bytes == len(torn)
    assert log_path.read_bytes() == whole  # cut, so the next append is not behind garbage
    again.ensure_queue("after", Plan())
    third = restarted(again, tmp_path)
    assert sorted(third.queues) == sorted([*(f"q{n}" for n in range(10)), "after"])


def test_a_log_line_failing_its_checksum_ends_the_replay(tmp_path: Path) -> None:
    broker = started(tmp_path)
    broker.ensure_queue("kept", Plan())
    broker.ensure_queue("flipped", Plan())
    broker.close()
    log_path = tmp_path / "addresses.log"
    lines = log_path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 2
    lines[1] = lines[1].replace(b"flipped", b"flopped")  # same length, wrong checksum
    log_path.write_bytes(b"".join(lines))

    again = started(tmp_path)

    assert list(again.queues) == ["kept"]
    assert again._catalog.torn_bytes == len(lines[1])


def test_compaction_keeps_the_state_and_bounds_the_log(tmp_path: Path) -> None:
    broker = started(tmp_path)
    broker.ensure_topic("prices", Plan())
    broker.subscribe("prices", identity="app-1", durable=True)
    changes = 3 * COMPACT_SLACK
    for n in range(changes):
        broker.ensure_queue(f"q{n % 50}", Plan(memory_limit_bytes=n), commit=False)
        if n % 64 == 63:  # commits of 64 changes each, as a burst of admin calls makes them
            broker.commit_catalog()
    broker.commit_catalog()
    log_lines = len((tmp_path / "addresses.log").read_bytes().splitlines())

    again = restarted(broker, tmp_path)

    assert log_lines < changes  # folded into the snapshot at least once
    snapshot = json.loads((tmp_path / "addresses.json").read_text())
    assert len(snapshot["queues"]) == 50
    last = {f"q{n % 50}": Plan(memory_limit_bytes=n) for n in range(changes)}
    assert {n: q.plan for n, q in again.queues.items()} == last
    assert sorted(again.topics["prices"].subscriptions) == ["app-1"]


def test_a_crash_between_snapshot_and_log_truncation_replays_harmlessly(tmp_path: Path) -> None:
    broker = started(tmp_path)
    broker.ensure_queue("a", Plan())
    broker.ensure_queue("b", Plan())
    broker.delete_queue("a")
    broker.ensure_topic("t", Plan())
    broker.subscribe("t", identity="s", durable=True)
    broker.delete_topic("t")
    broker.ensure_topic("t", Plan(default_ttl_ms=5))
    old_log = (tmp_path / "addresses.log").read_bytes()
    broker._catalog.compact()
    broker.close()
    (tmp_path / "addresses.log").write_bytes(old_log)  # the truncate never happened

    again = started(tmp_path)

    assert list(again.queues) == ["b"]
    assert again.topics["t"].plan == Plan(default_ttl_ms=5)
    assert again.topics["t"].subscriptions == {}


def test_a_catalog_of_the_older_whole_file_format_still_loads(tmp_path: Path) -> None:
    (tmp_path / "addresses.json").write_text(
        json.dumps(
            {
                "queues": {"orders": Plan(max_delivery_attempts=2).to_dict()},
                "topics": {"prices": Plan().to_dict()},
                "durable_subscriptions": {"prices": ["app-1"]},
            }
        )
    )
    broker = started(tmp_path)
    broker.ensure_queue("more", Plan())

    again = restarted(broker, tmp_path)

    assert {n: q.plan for n, q in again.queues.items()} == {
        "orders": Plan(max_delivery_attempts=2),
        "more": Plan(),
    }
    assert sorted(again.topics["prices"].subscriptions) == ["app-1"]


def test_uncommitted_changes_are_not_on_disk_and_one_commit_writes_them_all(
    tmp_path: Path,
) -> None:
    broker = started(tmp_path)
    for n in range(20):
        broker.ensure_queue(f"q{n}", Plan(), commit=False)
    assert broker._catalog.uncommitted == 20
    assert Catalog(tmp_path / "addresses.json").load().queues == {}

    broker.commit_catalog()

    assert broker._catalog.uncommitted == 0
    assert sorted(Catalog(tmp_path / "addresses.json").load().queues) == sorted(
        f"q{n}" for n in range(20)
    )


def test_ensuring_an_unchanged_queue_writes_nothing(tmp_path: Path) -> None:
    broker = started(tmp_path)
    broker.ensure_queue("orders", Plan())
    size = (tmp_path / "addresses.log").stat().st_size
    for _ in range(10):
        broker.ensure_queue("orders", Plan())
    assert (tmp_path / "addresses.log").stat().st_size == size


def test_2000_ensured_queues_survive_a_sigkill_right_after(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    stub = broker.admin()
    names = [f"bulk/q{n:04d}" for n in range(2000)]
    plan = resources_pb2.AddressPlanSpec(persistent=True, max_delivery_attempts=4)
    answered: list[str] = []
    for start in range(0, len(names), IN_FLIGHT):
        window = names[start : start + IN_FLIGHT]
        calls: list[grpc.Future] = [
            stub.EnsureQueue.future(
                broker_pb2.EnsureAddressRequest(name=name, plan=plan), timeout=30
            )
            for name in window
        ]
        answered.extend(call.result().name for call in calls)
    assert answered == names

    broker.kill()  # SIGKILL right after the last OK: no clean close, no flush
    broker.start()

    listed = broker.addresses()
    assert sorted(n for n in listed if n.startswith("bulk/")) == names
    assert {listed[n].plan.max_delivery_attempts for n in names} == {4}
