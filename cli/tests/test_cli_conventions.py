"""kubectl's conventions in `enmasse`, against a real `enmasse-config` over a real etcd.

What a kubectl user tries first, with the exact text and exit code of each failure: `get` of a
space or resource that does not exist; `-o name`; `-l` and `--field-selector`; `get --watch`;
`describe` (status, conditions, placement and the audit trail the config service logged);
`wait --for=phase=Active|delete --timeout` (exit 3 on timeout); `logs` of the config program;
`completion bash|zsh|fish`, loaded into a real bash. Statuses are written as the controllers
write them, through the config service's UpdateAddressStatus RPC.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from enmasse.cli import logs as component_logs
from enmasse.cli.main import cli
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.config_service import SPACE_QUEUES, ConfigProcess
from tests.fixtures.etcd import EtcdProcess

ENMASSE = Path(sys.executable).parent / "enmasse"
SPACE_OWN = [f"address/{name}" for name in SPACE_QUEUES]  # the space's DLQ and MQTT stores

SHOP = """\
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {name: shop}
spec: {type: standard, plan: standard-small}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {name: orders, space: shop, labels: {tier: gold, team: web}}
spec: {address: orders, type: queue, plan: standard-small-queue}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {name: refunds, space: shop, labels: {tier: silver}}
spec: {address: refunds, type: queue, plan: standard-small-queue}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {name: prices, space: shop}
spec: {address: prices, type: topic, plan: standard-small-topic}
"""


@pytest.fixture
def config(
    etcd: EtcdProcess, etcd_prefix: str, config_process_factory: Callable[..., ConfigProcess]
) -> ConfigProcess:
    return config_process_factory(etcd_endpoint=etcd.endpoint, prefix=etcd_prefix)


@pytest.fixture
def shop(config: ConfigProcess, tmp_path: Path) -> str:
    manifests = tmp_path / "shop.yaml"
    manifests.write_text(SHOP)
    code, _out, err = enmasse(config.target, "apply", "-f", str(manifests))
    assert (code, err) == (0, ""), err
    return config.target


def enmasse(server: str, *args: str, var_dir: Path | None = None) -> tuple[int, str, str]:
    var = ["--var-dir", str(var_dir)] if var_dir is not None else []
    result = CliRunner().invoke(cli, ["--server", server, *var, *args])
    # A traceback is a defect: only a clean exit (SystemExit) may end a command.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def set_status(
    server: str,
    *,
    space: str,
    name: str,
    phase: str,
    messages: tuple[str, ...] = (),
    brokers: tuple[resources_pb2.BrokerPlacement, ...] = (),
) -> None:
    """What the storage-controller and router-agent do: UpdateAddressStatus."""
    with grpc.insecure_channel(server) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        current = stub.GetAddress(config_pb2.ObjectRef(space=space, name=name), timeout=10)
        status = resources_pb2.AddressStatus(
            status=resources_pb2.Status(
                phase=phase,
                messages=list(messages),
                observed_generation=current.metadata.generation,
            ),
            brokers=list(brokers),
        )
        stub.UpdateAddressStatus(
            config_pb2.UpdateAddressStatusRequest(
                ref=config_pb2.ObjectRef(space=space, name=name), status=status
            ),
            timeout=10,
        )


def read_lines(process: subprocess.Popen[str]) -> queue.Queue[str]:
    """The process's stdout lines as they come (a thread reads them), without their newline."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in process.stdout or []:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return lines


# ---------------------------------------------------------------- get: missing things are errors


def test_get_of_a_missing_space_or_resource_is_an_error_with_exit_code_1(shop: str) -> None:
    assert enmasse(shop, "get", "addresses", "--space", "nosuch") == (
        1,
        "",
        "error: AddressSpace nosuch not found\n",
    )
    assert enmasse(shop, "get", "users", "-s", "nosuch", "-o", "json") == (
        1,
        "",
        "error: AddressSpace nosuch not found\n",
    )
    assert enmasse(shop, "get", "address", "nosuch", "--space", "shop") == (
        1,
        "",
        "error: Address shop/nosuch not found\n",
    )
    assert enmasse(shop, "get", "addressspace", "nosuch") == (
        1,
        "",
        "error: AddressSpace nosuch not found\n",
    )
    assert enmasse(shop, "get", "address", "orders") == (
        1,
        "",
        "error: addresses live in an address space: get NAME needs --space SPACE\n",
    )
    code, _out, err = enmasse(shop, "get", "widgets")
    assert code == 1
    assert err.startswith('error: unknown kind "widgets": expected one of addressspaceplans')
    # A usage error is click's: exit code 2, with the choices.
    code, _out, err = enmasse(shop, "get", "addresses", "-o", "xml")
    assert code == 2
    assert "Invalid value for '-o' / '--output': 'xml' is not one of" in err
    # An existing space with nothing in it is an empty list, not an error.
    assert enmasse(shop, "get", "users", "-s", "shop") == (0, "No messagingusers found.\n", "")
    # `watch` refuses a missing space the same way, at once.
    assert enmasse(shop, "watch", "addresses", "-s", "nosuch") == (
        1,
        "",
        "error: AddressSpace nosuch not found\n",
    )


def test_output_name_and_label_and_field_selectors(shop: str) -> None:
    assert enmasse(shop, "get", "addresses", "-s", "shop", "-o", "name") == (
        0,
        "".join(f"{name}\n" for name in [*SPACE_OWN, "address/orders", "address/prices"])
        + "address/refunds\n",
        "",
    )
    assert enmasse(shop, "get", "as", "shop", "-o", "name") == (0, "addressspace/shop\n", "")

    def names(*selector: str) -> list[str]:
        code, out, err = enmasse(shop, "get", "addresses", "-s", "shop", "-o", "name", *selector)
        assert (code, err) == (0, "")
        return out.splitlines()

    assert names("-l", "tier=gold") == ["address/orders"]
    assert names("-l", "tier==gold,team=web") == ["address/orders"]
    assert names("-l", "tier!=gold") == [*SPACE_OWN, "address/prices", "address/refunds"]
    assert names("-l", "tier in (gold, silver)") == ["address/orders", "address/refunds"]
    assert names("-l", "tier notin (gold)") == [*SPACE_OWN, "address/prices", "address/refunds"]
    assert names("-l", "tier") == ["address/orders", "address/refunds"]
    assert names("-l", "!tier") == [*SPACE_OWN, "address/prices"]
    assert names("--field-selector", "spec.type=topic") == ["address/prices"]
    assert names("--field-selector", "spec.type!=topic,metadata.name=refunds") == [
        "address/refunds"
    ]
    assert names("-l", "tier=bronze") == []
    # a table of nothing selected says so, as kubectl does
    code, out, _ = enmasse(shop, "get", "addresses", "-s", "shop", "-l", "tier=bronze")
    assert (code, out) == (0, "No addresses found.\n")

    set_status(shop, space="shop", name="refunds", phase="Active")
    assert names("--field-selector", "status.phase=Active") == ["address/refunds"]
    assert names("--field-selector", "status.status.phase!=Active") == [
        *SPACE_OWN,
        "address/orders",
        "address/prices",
    ]

    assert enmasse(shop, "get", "addresses", "-s", "shop", "-l", "tier=gold=x") == (
        1,
        "",
        "error: invalid label selector 'tier=gold=x': cannot read 'tier=gold=x' (expected "
        "key=value, key!=value, key, !key, key in (a,b) or key notin (a,b))\n",
    )
    assert enmasse(shop, "get", "addresses", "-s", "shop", "--field-selector", "phase") == (
        1,
        "",
        "error: invalid field selector 'phase': cannot read 'phase' "
        "(expected path=value or path!=value, e.g. status.phase=Active)\n",
    )


def test_get_watch_prints_the_listing_then_each_change(shop: str, tmp_path: Path) -> None:
    watcher = subprocess.Popen(
        [str(ENMASSE), "--server", shop, "get", "addresses", "-s", "shop", "-o", "name", "-w"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        lines = read_lines(watcher)
        listed = [lines.get(timeout=30) for _ in range(3 + len(SPACE_OWN))]
        assert listed == [*SPACE_OWN, "address/orders", "address/prices", "address/refunds"]
        # The listing is not printed a second time: the next line is the change.
        extra = tmp_path / "extra.yaml"
        extra.write_text(
            "apiVersion: enmasse.io/v1\nkind: Address\nmetadata: {name: returns, space: shop}\n"
            "spec: {address: returns, type: queue, plan: standard-small-queue}\n"
        )
        assert enmasse(shop, "apply", "-f", str(extra))[0] == 0
        assert lines.get(timeout=30) == "address/returns"
        assert enmasse(shop, "delete", "address", "prices", "-s", "shop")[0] == 0
        assert lines.get(timeout=30) == "address/prices"
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=30) == 0
        assert watcher.stderr is not None
        assert watcher.stderr.read() == ""
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait(timeout=10)


def test_get_watch_as_a_table_prints_rows_of_the_same_columns(shop: str, tmp_path: Path) -> None:
    watcher = subprocess.Popen(
        [str(ENMASSE), "--server", shop, "get", "addresses", "-s", "shop", "-w"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        lines = read_lines(watcher)
        listed = [lines.get(timeout=30).split() for _ in range(4 + len(SPACE_OWN))]
        assert listed[0] == ["SPACE", "NAME", "ADDRESS", "TYPE", "PLAN", "PHASE"]
        assert [row[1] for row in listed[1:]] == [
            *(name.removeprefix("address/") for name in SPACE_OWN),
            "orders",
            "prices",
            "refunds",
        ]
        set_status(shop, space="shop", name="orders", phase="Active")
        assert lines.get(timeout=30).split() == [
            "shop",
            "orders",
            "orders",
            "queue",
            "standard-small-queue",
            "Active",
        ]
        assert enmasse(shop, "delete", "address", "refunds", "-s", "shop")[0] == 0
        deleted = lines.get(timeout=30).split()
        assert (deleted[1], deleted[-1]) == ("refunds", "(deleted)")
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=30) == 0
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait(timeout=10)


# ---------------------------------------------------------------- describe / wait


def var_with_config_log(config: ConfigProcess, tmp_path: Path) -> Path:
    """A var dir whose log/config.log is the running config process's log (as under `up`)."""
    var = tmp_path / "var"
    (var / "log").mkdir(parents=True)
    (var / "log" / "config.log").symlink_to(config.workdir / "config.log")
    return var


def test_describe_shows_status_conditions_placement_and_audit_events(
    config: ConfigProcess, shop: str, tmp_path: Path
) -> None:
    set_status(
        shop,
        space="shop",
        name="orders",
        phase="Pending",
        messages=("no broker has room for 1 credit",),
        brokers=(
            resources_pb2.BrokerPlacement(
                broker="shop-broker-0", state="Active", waiting=True, reason="not created yet"
            ),
        ),
    )
    var = var_with_config_log(config, tmp_path)

    def audit_written() -> bool:
        return "UpdateAddressStatus" in (config.workdir / "config.log").read_text()

    assert wait_for(audit_written)
    code, out, err = enmasse(shop, "describe", "address", "orders", "-s", "shop", var_dir=var)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[:4] == [
        "Name:            orders",
        "Kind:            Address",
        "Space:           shop",
        "Labels:          team=web",
    ]
    assert lines[4] == "                 tier=gold"
    assert "Managed-By:      cli" in lines
    spec = lines.index("Spec:")
    assert lines[spec + 1 : spec + 4] == [
        "  address: orders",
        "  type: queue",
        "  plan: standard-small-queue",
    ]
    assert "  Phase:         Pending" in lines
    assert "  Ready     False   no broker has room for 1 credit" in lines
    assert "  Observed  True    -" in lines
    placement = lines.index("Placement:")
    assert lines[placement + 2].split() == [
        "shop-broker-0",
        "Active",
        "yes",
        "not",
        "created",
        "yet",
    ]
    events = lines.index(f"Events (audit log {var / 'log' / 'config.log'}):")
    assert lines[events + 1].split() == ["TIME", "WHO", "RPC", "OUTCOME"]
    audit = [line.split() for line in lines[events + 2 :]]
    assert [row[2:] for row in audit] == [["UpdateAddressStatus", "ok"]]

    # A config service elsewhere: no audit log here, and the text says where it looked.
    code, out, _ = enmasse(shop, "describe", "as", "shop", var_dir=tmp_path / "elsewhere")
    assert code == 0
    assert out.splitlines()[-1] == (
        f"Events:          <none: no audit log at {tmp_path / 'elsewhere' / 'log' / 'config.log'}>"
    )
    assert "Endpoints:       <none>" in out.splitlines()
    assert enmasse(shop, "describe", "address", "nosuch", "-s", "shop") == (
        1,
        "",
        "error: Address shop/nosuch not found\n",
    )


def wait_for(condition: Callable[[], bool], *, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_wait_for_phase_and_delete_with_exit_codes(shop: str) -> None:
    set_status(shop, space="shop", name="orders", phase="Pending", messages=("placing",))
    assert enmasse(
        shop, "wait", "address", "orders", "-s", "shop", "--for=phase=Active", "--timeout", "0.5"
    ) == (
        3,
        "",
        "error: timed out after 0.5 s waiting for address/orders phase Active: "
        "phase Pending: placing\n",
    )
    later = threading.Timer(
        1.0, lambda: set_status(shop, space="shop", name="orders", phase="Active")
    )
    later.start()
    try:
        assert enmasse(
            shop, "wait", "address", "orders", "-s", "shop", "--for", "phase=Active"
        ) == (0, "address/orders condition met\n", "")
    finally:
        later.join()

    assert enmasse(shop, "wait", "address", "nosuch", "-s", "shop", "--for=phase=Active") == (
        1,
        "",
        "error: address/nosuch not found\n",
    )
    assert enmasse(
        shop, "wait", "address", "prices", "-s", "shop", "--for=delete", "--timeout", "0.3"
    ) == (
        3,
        "",
        "error: timed out after 0.3 s waiting for address/prices to be deleted: it still exists\n",
    )
    assert enmasse(shop, "delete", "address", "prices", "-s", "shop")[0] == 0
    assert enmasse(shop, "wait", "address", "prices", "-s", "shop", "--for=delete") == (
        0,
        "address/prices condition met\n",
        "",
    )
    assert enmasse(shop, "wait", "address", "orders", "-s", "shop", "--for=ready") == (
        1,
        "",
        "error: --for=ready: expected --for=phase=PHASE (e.g. phase=Active) or --for=delete\n",
    )
    code, _out, err = enmasse(shop, "wait", "address", "orders", "-s", "shop")
    assert code == 2
    assert "Missing option '--for'" in err


def test_wait_and_exit_codes_are_documented_in_the_help() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert "Exit codes: 0 success; 1 an error" in " ".join(result.stdout.split())
    result = CliRunner().invoke(cli, ["wait", "--help"])
    assert "3 --timeout passed first" in " ".join(result.stdout.split())


# ---------------------------------------------------------------- logs


def test_logs_of_the_config_program_then_follow(
    config: ConfigProcess, shop: str, tmp_path: Path
) -> None:
    var = var_with_config_log(config, tmp_path)
    code, out, err = enmasse(shop, "logs", "config", "--tail", "1", var_dir=var)
    assert (code, err) == (0, "")
    assert out.splitlines() == (config.workdir / "config.log").read_text().splitlines()[-1:]

    assert enmasse(shop, "logs", "router", "-s", "shop", var_dir=var) == (
        1,
        "",
        "error: no component 'router' in space 'shop': expected one of config "
        "(or a role: router, broker, mqtt-gateway, with --space SPACE)\n",
    )
    empty = tmp_path / "empty"
    assert enmasse(shop, "logs", "config", var_dir=empty) == (
        1,
        "",
        f"error: no logs in {empty / 'log'}: has `enmasse up` run with this --var-dir?\n",
    )

    follower = subprocess.Popen(
        [str(ENMASSE), "--var-dir", str(var), "logs", "config", "-f", "--tail", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        lines = read_lines(follower)
        # Each status write is one new audit line; write until the follower (which starts
        # at the files' ends, whenever its process is up) has printed one.
        deadline = time.monotonic() + 60
        seen = ""
        while '"name": "refunds"' not in seen and time.monotonic() < deadline:
            set_status(shop, space="shop", name="refunds", phase="Active")
            try:
                seen = lines.get(timeout=1)
            except queue.Empty:
                continue
        assert '"rpc": "UpdateAddressStatus"' in seen
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=30) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait(timeout=10)


def test_log_components_by_role_and_space(tmp_path: Path) -> None:
    for program in ("config", "demo-router-0", "demo-router-1", "jms-broker-0", "demo-broker-0"):
        (tmp_path / f"{program}.log").write_text(f"{program} line 1\n{program} line 2\n")
    routers = component_logs.select(tmp_path, component="router", space="demo")
    assert [f.program for f in routers] == ["demo-router-0", "demo-router-1"]
    assert list(component_logs.show(routers, lines=1)) == [
        "[demo-router-0] demo-router-0 line 2",
        "[demo-router-1] demo-router-1 line 2",
    ]
    brokers = component_logs.select(tmp_path, component="broker")
    assert [f.program for f in brokers] == ["demo-broker-0", "jms-broker-0"]
    one = component_logs.select(tmp_path, component="jms-broker-0")
    assert list(component_logs.show(one, lines=-1)) == [
        "jms-broker-0 line 1",
        "jms-broker-0 line 2",
    ]


# ---------------------------------------------------------------- completion


def test_completion_scripts_load_in_a_real_bash_and_complete_kinds() -> None:
    for shell, marker in (
        ("bash", "_ENMASSE_COMPLETE=bash_complete"),
        ("zsh", "_ENMASSE_COMPLETE=zsh_complete"),
        ("fish", "_ENMASSE_COMPLETE=fish_complete"),
    ):
        result = subprocess.run(
            [str(ENMASSE), "completion", shell], capture_output=True, text=True, check=False
        )
        assert (result.returncode, result.stderr) == (0, ""), shell
        assert marker in result.stdout, shell
    loaded = subprocess.run(
        ["bash", "-c", f"source <({ENMASSE} completion bash) && complete -p enmasse"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip().endswith(" enmasse")
    # What bash asks when the user presses TAB after `enmasse get add`.
    asked = subprocess.run(
        [str(ENMASSE)],
        capture_output=True,
        text=True,
        check=False,
        env={
            **os.environ,
            "_ENMASSE_COMPLETE": "bash_complete",
            "COMP_WORDS": "enmasse get addr",
            "COMP_CWORD": "2",
        },
    )
    assert sorted(asked.stdout.splitlines()) == [
        "plain,addresses",
        "plain,addressplans",
        "plain,addressspaceplans",
        "plain,addressspaces",
    ]
    verbs = subprocess.run(
        [str(ENMASSE)],
        capture_output=True,
        text=True,
        check=False,
        env={
            **os.environ,
            "_ENMASSE_COMPLETE": "bash_complete",
            "COMP_WORDS": "enmasse des",
            "COMP_CWORD": "1",
        },
    )
    assert verbs.stdout.splitlines() == ["plain,describe"]
    assert (
        subprocess.run(
            [str(ENMASSE), "completion", "tcsh"], capture_output=True, text=True, check=False
        ).returncode
        == 2
    )
