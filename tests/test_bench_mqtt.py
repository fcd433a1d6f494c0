"""The MQTT bench (`bench/mqtt_bench.py`, `python -m bench mqtt`) at a tiny scale, so that it
cannot rot: 200 messages through `enmasse-mqtt-gateway` + router at QoS 0 and 1, throughput and
paced latency. The figures are not judged (speed is measured, never asserted); what is asserted is
that every measurement happened: the subscriber received what QoS 1 promises (everything; QoS 0
may lose by contract, so there only that something arrived; 200 is below both systems' 1,000-message
bound for a slow subscriber), latency percentiles were taken, and no device reported an error.
mosquitto's rows are checked apart, when its package is installed, and its "not installed" row.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.harness import Table
from bench.mqtt_bench import (
    COLUMNS,
    ENMASSE,
    MOSQUITTO,
    mosquitto_executable,
    mosquitto_rows,
    mqtt_table,
)

MESSAGES = 200
SECONDS = 0.2  # 200 paced messages at 1,000 msgs/s
pytestmark = pytest.mark.slow  # each system's four runs spawn eight device processes


def _rows(table: Table) -> list[dict[str, Any]]:
    return [dict(zip(table.columns, row, strict=True)) for row in table.rows]


def _assert_measured(rows: list[dict[str, Any]], system: str) -> None:
    assert [(row["system"], row["QoS"], row["run"]) for row in rows] == [
        (system, 0, "throughput"),
        (system, 0, "latency at 1,000 msgs/s"),
        (system, 1, "throughput"),
        (system, 1, "latency at 1,000 msgs/s"),
    ]
    for row in rows:
        assert (row["messages"], row["errors"]) == (MESSAGES, "-"), row
        assert 0 < row["received"] <= MESSAGES, row
        assert row["msgs/s"] > 0, row
        if row["QoS"] == 1:
            assert row["received"] == MESSAGES, row
        if row["run"] == "throughput":
            assert (row["p50 ms"], row["p99 ms"]) == ("-", "-"), row
        else:
            assert 0 < row["p50 ms"] <= row["p99 ms"], row


def test_the_mqtt_bench_runs_through_our_gateway_at_a_tiny_scale() -> None:
    table = mqtt_table(messages=MESSAGES, seconds=SECONDS, with_mosquitto=False)

    _assert_measured(_rows(table), ENMASSE)
    assert f"{MOSQUITTO} skipped: not asked for in this run." in table.notes


@pytest.mark.skipif(mosquitto_executable() is None, reason="mosquitto not installed")
def test_the_same_devices_measure_mosquitto_started_on_a_free_port() -> None:
    executable = mosquitto_executable()
    assert executable is not None
    table = Table("mosquitto", COLUMNS)
    mosquitto_rows(table, executable, messages=MESSAGES, seconds=SECONDS)

    _assert_measured(_rows(table), MOSQUITTO)


def test_without_mosquitto_installed_its_row_says_so_and_nothing_runs() -> None:
    table = Table("mosquitto", COLUMNS)
    mosquitto_rows(table, None, messages=MESSAGES, seconds=SECONDS)

    assert table.rows == [[MOSQUITTO, "-", "-", "-", "-", "-", "-", "-", "not installed"]]
    assert table.notes == [
        f"{MOSQUITTO} not installed (Debian package `mosquitto`): ours measured alone."
    ]
