"""The security bench (`bench/security_bench.py`, `python -m bench security`) in a tiny
configuration, so that it cannot rot: a few connections per mechanism and transport, a few
hundred messages with TLS off and on, two rule changes pushed to a router; RabbitMQ and the path
through `enmasse up` left out (their rows say so). The figures are not judged (speed is measured,
never asserted); what is asserted is that every measurement happened: each connection opened,
each message arrived, each rule change detached the link with amqp:unauthorized-access. And a
port that does not offer a mechanism gets "not offered", never a login with another one.
"""

from __future__ import annotations

from typing import Any

import pytest
from enmasse.amqp import sasl
from enmasse.amqp.engine import ConnectionHandler

from bench.harness import Table
from bench.security_bench import (
    MECHANISMS,
    RABBITMQ,
    ROUTER,
    SETUP_COLUMNS,
    TINY,
    Endpoint,
    security_tables,
    setup_rows,
    tls_cost_tables,
)

pytestmark = pytest.mark.slow


def _rows(table: Table) -> list[dict[str, Any]]:
    return [dict(zip(table.columns, row, strict=True)) for row in table.rows]


def test_the_security_bench_runs_in_a_tiny_configuration() -> None:
    setup, flow, ratios, rules = security_tables(TINY)

    opened = _rows(setup)
    assert [(r["system"], r["transport"], r["mechanism"], r["openers"]) for r in opened] == [
        (ROUTER, transport, mechanism, openers)
        for transport in ("plain", "TLS")
        for mechanism in MECHANISMS
        for openers in (1, TINY.openers)
    ]
    for row in opened:
        assert (row["opened"], row["errors"]) == (row["connections"], "-"), row
    offers = "SCRAM-SHA-512 SCRAM-SHA-256 PLAIN ANONYMOUS"
    assert f"{ROUTER}, plain port offers: {offers}." in setup.notes
    assert f"{ROUTER}, TLS port offers: {offers}." in setup.notes

    moved = _rows(flow)
    runs = [(1, "pre-settled", 100), (4, "acked", 1024)]
    assert [(r["transport"], r["pairs"], r["mode"], r["size B"]) for r in moved] == [
        (transport, pairs, mode, size)
        for pairs, mode, size in runs
        for transport in ("plain", "TLS")
    ]
    for row in moved:
        assert (row["received"], row["errors"]) == (TINY.messages, "-"), row
    assert [float(r["TLS / plain"]) > 0 for r in _rows(ratios)] == [True] * len(runs)

    (pushed,) = _rows(rules)
    assert (pushed["runs"], pushed["detached (unauthorized-access)"], pushed["errors"]) == (
        TINY.rule_changes,
        TINY.rule_changes,
        "-",
    )
    for table in (setup, flow, ratios):
        assert f"{RABBITMQ} skipped: not asked for in this run" in table.notes
    assert "The path through `enmasse up` was not asked for in this run." in rules.notes


def test_the_tls_cost_suite_runs_the_router_throughput_part_alone() -> None:
    flow, ratios = tls_cost_tables(TINY)

    moved = _rows(flow)
    assert [(r["system"], r["transport"], r["size B"]) for r in moved] == [
        (ROUTER, transport, size) for size in (100, 1024) for transport in ("plain", "TLS")
    ]
    for row in moved:
        assert (row["received"], row["errors"]) == (TINY.messages, "-"), row
    assert [r["target"] for r in _rows(ratios)] == [">= 0.75", ">= 0.75"]


def test_a_mechanism_a_port_does_not_offer_is_reported_not_tried(amqp_listener) -> None:
    """A listener offering SCRAM only (and knowing no user): ANONYMOUS and PLAIN are "not
    offered", SCRAM is tried and every refused login is counted, none opened."""
    nobody = sasl.Passwords(lambda _user, _password: False, scram=lambda _m, _user: None)
    _engine, port = amqp_listener(ConnectionHandler, authenticator=nobody)
    endpoint = Endpoint(
        system="scram only",
        plain_port=port,
        tls_port=0,
        ca_file="",
        user="mallory",
        password="guess",
        peer_pid=None,
    )
    table = Table("set-up", SETUP_COLUMNS)
    setup_rows(table, endpoint, TINY)
    rows = _rows(table)
    assert [(r["transport"], r["mechanism"], r["errors"]) for r in rows[:2]] == [
        ("plain", "ANONYMOUS", "not offered"),
        ("plain", "PLAIN", "not offered"),
    ]
    refused = "Condition('amqp:unauthorized-access', 'Authentication failed [mech=SCRAM-SHA-256]')"
    for row in rows[2:4]:
        assert (row["mechanism"], row["opened"]) == ("SCRAM-SHA-256", 0), row
        assert refused in row["errors"], row
    assert (rows[4]["transport"], rows[4]["errors"]) == ("TLS", "no TLS listener")
    assert len(rows) == 5
    assert table.notes == ["scram only, plain port offers: SCRAM-SHA-512 SCRAM-SHA-256."]
