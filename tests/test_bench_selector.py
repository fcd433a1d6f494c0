"""The selector bench (`bench/selector_bench.py`, `python -m bench selector`) at a tiny scale, so
that it cannot rot: 1,000 messages (1 in 10 red) on `enmasse-broker` through every scenario. The
figures are not judged (speed is measured, never asserted); what is asserted is that every
measurement happened and selected what it says: each consumer received exactly its share and
nothing of the wrong colour, and what a lone red consumer leaves stays in the queue. RabbitMQ's
rows (a node takes a while to start) are checked apart, when its package is installed.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest
from enmasse.amqp.selector import SELECTOR_FILTER_SYMBOL

from bench.harness import Table
from bench.selector_bench import (
    COLUMNS,
    ENMASSE,
    NOT_RED,
    RABBITMQ,
    RED,
    Endpoint,
    drain,
    rabbitmq_rows,
    selector_table,
)
from tests.fixtures.broker import BrokerProcess

MESSAGES = 1000
pytestmark = pytest.mark.slow  # 15-25 s for the tiny run on a loaded 2-core machine


def _rows(table: Table) -> list[dict[str, Any]]:
    return [dict(zip(table.columns, row, strict=True)) for row in table.rows]


def test_the_selector_bench_runs_at_a_tiny_scale() -> None:
    table = selector_table(messages=MESSAGES, with_rabbitmq=False)

    rows = _rows(table)
    wanted = ["system", "consumer", "expected", "received", "wrong colour", "left in queue"]
    assert [[row[c] for c in wanted] + [row["errors"]] for row in rows] == [
        [ENMASSE, "no selector", 1000, 1000, "-", 0, "-"],
        [ENMASSE, RED, 100, 100, 0, 900, "-"],  # the blue ones stay for other consumers
        [ENMASSE, RED, 100, 100, 0, 0, "-"],
        [ENMASSE, NOT_RED, 900, 900, 0, 0, "-"],
    ]
    assert [row["scenario"] for row in rows] == [
        "plain consumer (reference)",
        "1 selector consumer",
        "2 selector consumers at once",
        "2 selector consumers at once",
    ]
    for row in rows:
        assert row["msgs/s"] > 0, row
        assert row["drain ms"] > 0, row
    assert f"{RABBITMQ} skipped: not asked for in this run." in table.notes


def test_a_consumer_whose_selector_selects_nothing_stops_idle_and_says_so(
    broker: BrokerProcess,
) -> None:
    """Nothing matches: the consumer reports what it got (nothing) and why it stopped."""
    broker.ensure_queue("empty-handed", persistent=False)
    endpoint = Endpoint(system=ENMASSE, host="127.0.0.1", port=broker.amqp_port, pid=broker.pid)
    _started, (result,), _cpu = drain(endpoint, "empty-handed", consumers=[(RED, 1)])
    assert (result.received, result.wrong, result.error) == (0, 0, "nothing new for 5 s")


@pytest.mark.skipif(not shutil.which("rabbitmq-server"), reason="rabbitmq-server not installed")
def test_rabbitmq_3_10_accepts_and_echoes_the_selector_but_delivers_everything() -> None:
    """What the note records: the plugin's attach echoes the filter, yet every message arrives;
    so RabbitMQ has no equivalent row and runs the plain consumer only, as a reference."""
    table = Table("rabbitmq", COLUMNS)
    rabbitmq_rows(table, messages=MESSAGES)

    (note,) = [n for n in table.notes if n.startswith(RABBITMQ)]
    assert note == (
        f'{RABBITMQ} (AMQP 1.0 plugin) to a receiver with `{SELECTOR_FILTER_SYMBOL}` "{RED}": '
        "attach accepted, filter echoed in its attach: {symbol('selector'): "
        "Described(symbol('apache.org:selector-filter:string'), \"colour = 'red'\")}; delivered "
        "20 messages (2 red, 18 not red) of 20 (2 red)."
    )
    plain, no_equivalent = _rows(table)
    assert (plain["consumer"], plain["received"], plain["errors"]) == ("no selector", 1000, "-")
    assert no_equivalent["errors"].startswith("no equivalent")
