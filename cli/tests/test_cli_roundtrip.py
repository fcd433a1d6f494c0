"""The CLI against a real `enmasse-config` process over a real etcd: apply, get, delete, watch.

Each test gets its own config process and etcd key prefix (the default plans seeded), and drives
the `enmasse` command as a user would, asserting on what is printed and on what the server then
holds.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from enmasse.cli.main import cli

from tests.fixtures.config_service import SPACE_QUEUES, ConfigProcess
from tests.fixtures.etcd import EtcdProcess

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENMASSE = Path(sys.executable).parent / "enmasse"

APPLIED_EXAMPLES = [
    "addressspace/demo created",
    "address/orders created",
    "address/prices created",
    "address/prices-audit created",
    "address/rpc created",
    "address/events created",
    "messaginguser/app created",
    "address/dlq created",  # each space's DLQ, which its queues' plans name
    # a standard-small space serves MQTT: the gateway's store queues come with it
    "address/mqtt-retained created",
    "address/mqtt-wills created",
    "address/mqtt-sessions created",
    "addressspace/jms created",
    "address/invoices created",
    "address/notifications created",
    "messaginguser/app created",
    "address/dlq created",
]


@pytest.fixture
def server(
    etcd: EtcdProcess, etcd_prefix: str, config_process_factory: Callable[..., ConfigProcess]
) -> str:
    return config_process_factory(etcd_endpoint=etcd.endpoint, prefix=etcd_prefix).target


def enmasse(server: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--server", server, *args])
    # A traceback is a defect: only a clean exit (SystemExit) may end a command.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def table(text: str) -> list[dict[str, str]]:
    header, *rows = text.splitlines()
    names = header.split()
    return [dict(zip(names, row.split(), strict=True)) for row in rows]


def test_apply_get_delete_round_trip(server: str) -> None:
    code, out, err = enmasse(server, "apply", "-f", str(EXAMPLES))
    assert (code, err) == (0, "")
    assert out.splitlines() == APPLIED_EXAMPLES

    code, out, _ = enmasse(server, "apply", "-f", str(EXAMPLES))
    assert out.splitlines() == [
        line.replace("created", "unchanged")
        for line in APPLIED_EXAMPLES
        if "dlq" not in line and "mqtt-" not in line
    ]

    code, out, _ = enmasse(server, "get", "addresses", "--space", "demo")
    assert code == 0
    rows = {row["NAME"]: row for row in table(out)}
    assert sorted(rows) == sorted(
        ["events", "orders", "prices", "prices-audit", "rpc", *SPACE_QUEUES]
    )
    assert rows["orders"] == {
        "SPACE": "demo",
        "NAME": "orders",
        "ADDRESS": "orders",
        "TYPE": "queue",
        "PLAN": "standard-small-queue",
        "PHASE": "-",
    }
    assert rows["prices-audit"]["TYPE"] == "subscription"

    code, out, _ = enmasse(server, "get", "addresses", "--space", "demo", "-o", "wide")
    assert code == 0
    rows = {row["NAME"]: row for row in table(out)}
    assert rows["dlq"] == {
        "SPACE": "demo",
        "NAME": "dlq",
        "ADDRESS": "DLQ",
        "TYPE": "queue",
        "PLAN": "standard-small-queue",
        "PHASE": "-",
        "MANAGED-BY": "enmasse-space",
        "DEAD-LETTERED": "0",
        "DEAD-HELD": "0",
    }
    assert rows["orders"]["MANAGED-BY"] == "cli"

    code, out, _ = enmasse(server, "get", "as", "-o", "yaml")
    docs = list(yaml.safe_load_all(out))
    assert [(d["kind"], d["metadata"]["name"], d["spec"]) for d in docs] == [
        ("AddressSpace", "demo", {"type": "standard", "plan": "standard-small"}),
        ("AddressSpace", "jms", {"type": "brokered", "plan": "brokered-single"}),
    ]
    assert all(d["apiVersion"] == "enmasse.io/v1" for d in docs)

    code, out, _ = enmasse(server, "get", "addr", "invoices", "-s", "jms", "-o", "json")
    invoices = json.loads(out)
    assert invoices["metadata"]["space"] == "jms"
    assert invoices["metadata"]["managedBy"] == "cli"
    assert invoices["spec"] == {"address": "invoices", "type": "queue", "plan": "brokered-queue"}

    code, out, _ = enmasse(server, "get", "users", "-o", "json")
    users = json.loads(out)
    assert sorted((u["metadata"]["space"], u["spec"]["username"]) for u in users) == [
        ("demo", "app"),
        ("jms", "app"),
    ]
    assert all("password" not in u["spec"] for u in users)  # input only, never returned

    code, out, _ = enmasse(server, "delete", "address", "rpc", "--space", "demo")
    assert (code, out) == (0, "address/rpc deleted\n")
    code, out, err = enmasse(server, "get", "address", "rpc", "--space", "demo")
    assert (code, out, err) == (1, "", "error: Address demo/rpc not found\n")
    code, out, _ = enmasse(server, "get", "addresses", "--space", "demo")
    assert sorted(row["NAME"] for row in table(out)) == sorted(
        ["events", "orders", "prices", "prices-audit", *SPACE_QUEUES]
    )


def test_a_missing_plan_is_refused_with_the_servers_message_and_nothing_is_written(
    server: str, tmp_path: Path
) -> None:
    (tmp_path / "space.yaml").write_text(
        "apiVersion: enmasse.io/v1\nkind: AddressSpace\nmetadata: {name: shop}\n"
        "spec: {type: standard, plan: standard-small}\n---\n"
        "apiVersion: enmasse.io/v1\nkind: Address\nmetadata: {name: orders, space: shop}\n"
        "spec: {address: orders, type: queue, plan: gold-queue}\n"
    )
    code, out, err = enmasse(server, "apply", "-f", str(tmp_path))
    assert (code, out) == (1, "")
    assert err == (
        "error: apply refused: Address shop/orders: spec.plan: "
        "address plan 'gold-queue' not found\n"
    )
    code, out, _ = enmasse(server, "get", "addressspaces")
    assert (code, out) == (0, "No addressspaces found.\n")  # atomic: the space was not written


def test_a_stale_delete_is_aborted_and_says_to_retry(server: str) -> None:
    enmasse(server, "apply", "-f", str(EXAMPLES / "jms-space.yaml"))
    _, out, _ = enmasse(server, "get", "address", "invoices", "-s", "jms", "-o", "json")
    version = int(json.loads(out)["metadata"]["resourceVersion"])
    code, out, err = enmasse(
        server, "delete", "addr", "invoices", "-s", "jms", "--resource-version", str(version - 1)
    )
    assert (code, out) == (1, "")
    assert err == (
        f"error: Address jms/invoices has been modified: resource_version {version - 1} is stale, "
        f"current is {version} (it changed since it was read: get it again and retry)\n"
    )
    code, out, _ = enmasse(
        server, "delete", "addr", "invoices", "-s", "jms", "--resource-version", str(version)
    )
    assert (code, out) == (0, "address/invoices deleted\n")


def read_lines(stream: object, lines: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.put(line.rstrip("\n"))


def next_line(lines: queue.Queue[str], *, timeout: float = 15.0) -> str:
    return lines.get(timeout=timeout)


def test_watch_streams_changes_and_quits_cleanly_on_ctrl_c(server: str) -> None:
    enmasse(server, "apply", "-f", str(EXAMPLES / "jms-space.yaml"))
    watcher = subprocess.Popen(
        [str(ENMASSE), "--server", server, "watch", "addresses", "--space", "jms"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=read_lines, args=(watcher.stdout, lines), daemon=True).start()
        assert {next_line(lines), next_line(lines), next_line(lines)} == {
            "ADDED    address/dlq space=jms",
            "ADDED    address/invoices space=jms",
            "ADDED    address/notifications space=jms",
        }
        enmasse(server, "delete", "address", "invoices", "--space", "jms")
        assert next_line(lines) == "DELETED  address/invoices space=jms"
        enmasse(server, "apply", "-f", str(EXAMPLES / "jms-space.yaml"))
        assert next_line(lines) == "ADDED    address/invoices space=jms"
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=15) == 0
        assert watcher.stderr is not None
        assert watcher.stderr.read() == ""  # no traceback, no "Aborted!"
    finally:
        if watcher.poll() is None:
            os.kill(watcher.pid, signal.SIGKILL)
            watcher.wait(timeout=10)


def test_watch_resumes_after_the_config_service_is_killed_and_missing_nothing(
    etcd: EtcdProcess, etcd_prefix: str, config_process_factory: Callable[..., ConfigProcess]
) -> None:
    config = config_process_factory(etcd_endpoint=etcd.endpoint, prefix=etcd_prefix)
    enmasse(config.target, "apply", "-f", str(EXAMPLES / "jms-space.yaml"))
    watcher = subprocess.Popen(
        [str(ENMASSE), "--server", config.target, "watch", "addressspaces"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=read_lines, args=(watcher.stdout, lines), daemon=True)
        reader.start()
        assert next_line(lines) == "ADDED    addressspace/jms"
        config.kill()
        config.start()  # same port
        code, _out, err = enmasse(config.target, "apply", "-f", str(EXAMPLES / "demo-space.yaml"))
        assert (code, err) == (0, "")
        # Only the new space: the resumed stream neither repeats `jms` nor misses `demo`.
        try:
            resumed = next_line(lines, timeout=40)
        except queue.Empty:
            gone = watcher.poll()
            said = watcher.stderr.read() if gone is not None and watcher.stderr else ""
            pytest.fail(f"no event after the restart; watcher exit {gone}, stderr {said!r}")
        assert resumed == "ADDED    addressspace/demo"
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=15) == 0
        reader.join(timeout=10)  # every line the watcher printed has been read
        assert lines.empty()
    finally:
        if watcher.poll() is None:
            os.kill(watcher.pid, signal.SIGKILL)
            watcher.wait(timeout=10)


def test_watch_without_a_server_is_a_clear_error_not_a_hang() -> None:
    watcher = subprocess.run(
        [str(ENMASSE), "--server", "127.0.0.1:1", "watch", "as"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (watcher.returncode, watcher.stdout) == (1, "")
    assert watcher.stderr == (
        "error: cannot reach the config service at 127.0.0.1:1: is `enmasse up` running?\n"
    )
