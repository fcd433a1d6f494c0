"""`send` / `receive` / `peek` / `stats` as a developer reaches for them, through a real router
and broker of `enmasse up` (the session's local runtime): application properties, TTL,
durability, a count and a rate, bodies from stdin and files, messages as JSON lines; a queue
browsed without consuming; per-address numbers from the routers and brokers.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from enmasse.cli import message_lines
from enmasse.cli.client import CliError

from tests.fixtures.local_runtime import ENMASSE, LocalRuntime, enmasse

pytestmark = pytest.mark.slow

SPACE = "helpers"
MANIFESTS = f"""\
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {{name: {SPACE}}}
spec: {{type: standard, plan: standard-small}}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {{name: jobs, space: {SPACE}}}
spec: {{address: jobs, type: queue, plan: standard-small-queue}}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {{name: browsed, space: {SPACE}}}
spec: {{address: browsed, type: queue, plan: standard-small-queue}}
---
apiVersion: enmasse.io/v1
kind: MessagingUser
metadata: {{name: dev, space: {SPACE}}}
spec:
  username: dev
  password: dev-password
  authorization:
    - addresses: ["#"]
      operations: [send, recv]
"""
LOGIN = ("--space", SPACE, "--user", "dev", "--password", "dev-password")


@pytest.fixture(scope="module")
def runtime(local_runtime: LocalRuntime) -> LocalRuntime:
    local_runtime.apply(MANIFESTS, name="helpers.yaml")
    local_runtime.wait_active(SPACE, ["jobs", "browsed"])
    return local_runtime


def cli(
    runtime: LocalRuntime, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The real `enmasse` against the runtime, stdin given when `stdin` is."""
    if stdin is None:
        return enmasse(runtime.var, *args)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENMASSE_")}
    return subprocess.run(
        [str(ENMASSE), "--var-dir", str(runtime.var), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def test_send_with_properties_ttl_durable_and_a_rate_then_receive_as_json(
    runtime: LocalRuntime,
) -> None:
    started = time.monotonic()
    sent = cli(
        runtime,
        "send",
        "jobs",
        *LOGIN,
        "--body",
        "resize",
        "-n",
        "3",
        "--rate",
        "4",
        "-P",
        "region=eu",
        "-P",
        "attempt=2",
        "-P",
        "urgent=true",
        "--ttl",
        "600000",
        "--durable",
    )
    elapsed = time.monotonic() - started
    assert (sent.returncode, sent.stdout, sent.stderr) == (
        0,
        "sent 3 messages to queue 'jobs' (accepted)\n",
        "",
    )
    assert elapsed >= 0.5  # three sends at 4 a second: the third no sooner than 0.5 s in

    got = cli(runtime, "receive", "jobs", *LOGIN, "-n", "3", "-o", "json")
    assert got.returncode == 0, got.stderr
    messages = [json.loads(line) for line in got.stdout.splitlines()]
    assert len(messages) == 3
    for message in messages:
        assert message["body"] == "resize"
        assert message["durable"] is True
        assert message["application_properties"] == {
            "region": "eu",
            "attempt": 2,
            "urgent": True,
        }
        assert 0 < message["ttl"] <= 600000


def test_bodies_from_stdin_line_by_line_and_from_a_file(
    runtime: LocalRuntime, tmp_path: Path
) -> None:
    sent = cli(runtime, "send", "jobs", *LOGIN, "--body-file", "-", "--lines", stdin="a\nb\n\nc\n")
    assert (sent.returncode, sent.stdout) == (0, "sent 3 messages to queue 'jobs' (accepted)\n")
    document = tmp_path / "order.json"
    document.write_text('{"order": 7}\n')
    sent = cli(runtime, "send", "jobs", *LOGIN, "--body-file", str(document))
    assert (sent.returncode, sent.stdout) == (0, "sent 1 message to queue 'jobs' (accepted)\n")
    got = cli(runtime, "receive", "jobs", *LOGIN, "-n", "4")
    assert (got.returncode, got.stdout) == (0, 'a\nb\nc\n{"order": 7}\n\n')

    missing = cli(runtime, "send", "jobs", *LOGIN, "--body-file", str(tmp_path / "nope"))
    assert (missing.returncode, missing.stderr) == (
        1,
        f"error: cannot read {tmp_path / 'nope'}: No such file or directory\n",
    )
    bad = cli(runtime, "send", "jobs", *LOGIN, "-P", "novalue")
    assert (bad.returncode, bad.stderr) == (1, "error: --property 'novalue': expected KEY=VALUE\n")
    lines_alone = cli(runtime, "send", "jobs", *LOGIN, "--lines")
    assert (lines_alone.returncode, lines_alone.stderr) == (
        1,
        "error: --lines needs --body-file FILE (or - for stdin)\n",
    )


def test_peek_browses_a_queue_without_consuming_it(runtime: LocalRuntime) -> None:
    for body in ("first", "second", "third"):
        assert cli(runtime, "send", "browsed", *LOGIN, "--body", body).returncode == 0
    peeked = cli(runtime, "peek", "browsed", *LOGIN, "-n", "2")
    assert (peeked.returncode, peeked.stdout, peeked.stderr) == (0, "first\nsecond\n", "")
    again = cli(runtime, "peek", "browsed", *LOGIN, "-o", "json", "--timeout", "1")
    assert [json.loads(line)["body"] for line in again.stdout.splitlines()] == [
        "first",
        "second",
        "third",
    ]
    # Nothing was consumed: a receiver gets all three, in order.
    got = cli(runtime, "receive", "browsed", *LOGIN, "-n", "3")
    assert (got.returncode, got.stdout) == (0, "first\nsecond\nthird\n")
    empty = cli(runtime, "peek", "browsed", *LOGIN, "--timeout", "1")
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, "", "")


def test_stats_per_address_from_the_routers_and_brokers(runtime: LocalRuntime) -> None:
    for body in ("s1", "s2"):
        assert cli(runtime, "send", "browsed", *LOGIN, "--body", body).returncode == 0
    shown = cli(runtime, "stats", "--space", SPACE)
    assert shown.returncode == 0, shown.stderr
    header, *rows = (line.split() for line in shown.stdout.splitlines())
    assert header == ["ADDRESS", "TYPE", "IN", "OUT", "STORED", "CONSUMERS", "PRODUCERS"]
    by_address = {row[0]: row for row in rows}
    # the space's own queues come with it: its DLQ and the MQTT gateway's stores
    assert sorted(by_address) == [
        "DLQ",
        "browsed",
        "jobs",
        "mqtt/retained",
        "mqtt/sessions",
        "mqtt/wills",
    ]
    browsed = by_address["browsed"]
    assert browsed[1] == "queue"
    assert int(browsed[2]) >= 2  # in: at least what this test sent
    assert browsed[4] == "2"  # stored: the two this test left there
    assert browsed[5:] == ["0", "0"]  # nobody attached now

    nosuch = cli(runtime, "stats", "--space", "nosuch")
    assert (nosuch.returncode, nosuch.stderr) == (1, "error: AddressSpace nosuch not found\n")


def test_property_values_are_typed_as_json_reads_them() -> None:
    assert message_lines.parse_properties(["a=1", "b=1.5", "c=true", "d=x", 'e="7"', "f="]) == {
        "a": 1,
        "b": 1.5,
        "c": True,
        "d": "x",
        "e": "7",
        "f": "",
    }
    with pytest.raises(CliError, match="expected KEY=VALUE"):
        message_lines.parse_properties(["=x"])
