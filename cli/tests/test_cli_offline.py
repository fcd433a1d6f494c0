"""`enmasse validate` and the other verbs that need no server: exact lines, exact exit codes."""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from enmasse.cli.client import ListPhase, dropped
from enmasse.cli.kinds import resolve_kind
from enmasse.cli.local.ports import Ports
from enmasse.cli.local.programs import program_commands, render_supervisord_conf
from enmasse.cli.local.var_dir import VarDir
from enmasse.cli.main import cli
from enmasse.v1 import config_pb2, resources_pb2

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SPACE = """\
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {name: demo}
spec: {type: standard, plan: standard-small}
"""
ORDERS_WITH_MISSING_PLAN = """\
# an address whose plan does not exist
apiVersion: enmasse.io/v1
kind: Address
metadata:
  name: orders
  space: demo
spec:
  address: orders
  type: queue
  plan: no-such-plan
"""
UNKNOWN_KIND = """\
apiVersion: enmasse.io/v1
kind: Queue
metadata: {name: q}
"""
BAD_YAML = """\
apiVersion: enmasse.io/v1
kind: Address
metadata:
  name: x
   space: demo
"""


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    # A traceback is a defect: only a clean exit (SystemExit) may end a command.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def test_validate_prints_each_broken_manifest_as_file_line_message(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text(SPACE)
    (tmp_path / "orders.yaml").write_text(ORDERS_WITH_MISSING_PLAN)
    (tmp_path / "queue.yaml").write_text(UNKNOWN_KIND)
    (tmp_path / "syntax.yaml").write_text(BAD_YAML)
    code, out, err = run("validate", "-f", str(tmp_path))
    assert code == 1
    assert out.splitlines() == [
        f"{tmp_path}/orders.yaml:10: Address demo/orders: spec.plan: "
        "address plan 'no-such-plan' not found",
        f'{tmp_path}/queue.yaml:2: unknown kind "Queue": expected one of '
        "AddressSpacePlan, AddressPlan, AddressSpace, Address, MessagingUser",
        f"{tmp_path}/syntax.yaml:5: YAML syntax error: mapping values are not allowed here",
    ]
    assert err == "3 error(s)\n"


def test_the_examples_are_valid() -> None:
    code, out, _err = run("validate", "-f", str(EXAMPLES))
    assert (code, out) == (0, "11 manifests valid\n")


def test_examples_hold_every_address_type_and_a_brokered_space() -> None:
    from enmasse.resources.manifests import load_paths

    loaded = load_paths([EXAMPLES])
    addresses = [m.resource.address for m in loaded.manifests if m.kind == "Address"]
    demo = {a.spec.type for a in addresses if a.metadata.space == "demo"}
    assert demo == {"queue", "topic", "subscription", "anycast", "multicast"}
    spaces = {
        m.resource.address_space.spec.type for m in loaded.manifests if m.kind == "AddressSpace"
    }
    assert spaces == {"standard", "brokered"}


def test_an_unknown_kind_is_refused_with_the_accepted_words() -> None:
    code, out, err = run("--server", "127.0.0.1:1", "get", "queues")
    assert (code, out) == (1, "")
    assert err == (
        'error: unknown kind "queues": expected one of addressspaceplans (asp/spaceplan/'
        "spaceplans), addressplans (ap/plan/plans), addressspaces (as/space/spaces), addresses "
        "(addr/addrs), messagingusers (user/users/mu)\n"
    )


@pytest.mark.parametrize(
    ("word", "kind"),
    [
        ("addresses", "Address"),
        ("address", "Address"),
        ("addr", "Address"),
        ("addressspaces", "AddressSpace"),
        ("AddressSpace", "AddressSpace"),
        ("as", "AddressSpace"),
        ("addressplans", "AddressPlan"),
        ("addressspaceplans", "AddressSpacePlan"),
        ("messagingusers", "MessagingUser"),
        ("users", "MessagingUser"),
    ],
)
def test_kubectl_like_kind_words(word: str, kind: str) -> None:
    assert resolve_kind(word).name == kind


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_server_down_is_a_clear_message_not_a_traceback(tmp_path: Path) -> None:
    port = closed_port()
    code, out, err = run("--server", f"127.0.0.1:{port}", "get", "addresses")
    assert (code, out) == (1, "")
    assert err == (
        f"error: cannot reach the config service at 127.0.0.1:{port}: is `enmasse up` running?\n"
    )


def test_the_server_address_comes_from_the_file_enmasse_up_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ENMASSE_SERVER", raising=False)
    port = closed_port()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.addr").write_text(f"127.0.0.1:{port}\n")
    code, _out, err = run("--var-dir", str(tmp_path), "get", "as")
    assert code == 1
    assert f"at 127.0.0.1:{port}:" in err


def test_apply_of_a_bad_file_applies_nothing_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "q.yaml").write_text(UNKNOWN_KIND)
    # The server address is closed: reaching it would be a different error.
    code, out, err = run("--server", f"127.0.0.1:{closed_port()}", "apply", "-f", str(tmp_path))
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f'{tmp_path}/q.yaml:2: unknown kind "Queue": expected one of AddressSpacePlan, '
        "AddressPlan, AddressSpace, Address, MessagingUser",
        "error: 1 bad manifest(s): nothing applied",
    ]


def test_status_and_down_when_nothing_runs(tmp_path: Path) -> None:
    code, _out, err = run("--var-dir", str(tmp_path), "status")
    assert (code, err) == (1, f"error: enmasse is not running (no supervisord for {tmp_path})\n")
    code, out, _err = run("--var-dir", str(tmp_path), "down")
    assert (code, out) == (0, f"enmasse is not running (nothing to stop in {tmp_path})\n")


def test_supervisord_config_supervises_etcd_then_config(tmp_path: Path) -> None:
    var = VarDir(tmp_path)
    ports = Ports(
        etcd_client=2379,
        etcd_peer=2380,
        config=5680,
        storage_controller=5681,
        router_agent=5682,
        subscription=5683,
        console=5684,
    )
    conf = render_supervisord_conf(var=var, commands=program_commands(var=var, ports=ports))
    assert f"file = {tmp_path}/run/supervisor.sock" in conf
    assert "[program:etcd]\ncommand = /usr/bin/etcd --name=enmasse" in conf
    assert "--listen-client-urls=https://127.0.0.1:2379" in conf  # etcd: mutual TLS only
    assert "--client-cert-auth" in conf
    assert f"--etcd-tls-dir={tmp_path}/tls/config-etcd" in conf
    assert conf.count("--tls-dir=") == 4  # config, storage-controller, router-agent, subscription
    assert "--listen=127.0.0.1:5680" in conf
    assert "--etcd=127.0.0.1:2379" in conf
    assert conf.count("autorestart = true") == 7  # the control plane; routers, brokers: included
    assert f"--url-file={tmp_path}/run/console.url" in conf
    assert conf.index("[program:etcd]") < conf.index("[program:config]")
    assert f"[include]\nfiles = {tmp_path}/supervisor.d/*.conf" in conf


class _Failed(grpc.RpcError):
    """An RPC's failure as gRPC hands it to the CLI: a status code and its details."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "details", "resumed"),
    [
        (grpc.StatusCode.UNAVAILABLE, "Socket closed", True),
        (grpc.StatusCode.UNKNOWN, "Stream removed", True),  # a killed server, now and then
        (grpc.StatusCode.UNKNOWN, "boom", False),
        (grpc.StatusCode.INVALID_ARGUMENT, "kinds: 'x' is not a kind", False),
        (grpc.StatusCode.OUT_OF_RANGE, "resource_version 3 has been compacted; re-list", False),
    ],
)
def test_watch_resumes_on_a_dropped_connection_only(
    code: grpc.StatusCode, details: str, resumed: bool
) -> None:
    assert dropped(_Failed(code, details)) is resumed


def _space(name: str, version: int) -> resources_pb2.Resource:
    meta = resources_pb2.Metadata(name=name, resource_version=version)
    return resources_pb2.Resource(address_space=resources_pb2.AddressSpace(metadata=meta))


def _lines(events: list[config_pb2.WatchEvent]) -> list[str]:
    Event = config_pb2.WatchEvent
    return [
        f"{Event.Type.Name(e.type)} {e.object.address_space.metadata.name}".strip() for e in events
    ]


def test_a_list_cut_short_is_listed_again_without_repeats() -> None:
    Event = config_pb2.WatchEvent
    listing = ListPhase()
    listing.restart()
    first = [Event(type=Event.ADDED, object=_space(n, 1)) for n in ("a", "b", "d")]
    assert _lines([e for event in first for e in listing.passed_on(event)]) == [
        "ADDED a",
        "ADDED b",
        "ADDED d",
    ]
    # The stream dropped before SYNCED; meanwhile b changed, c came and d went.
    listing.restart()
    second = [
        Event(type=Event.ADDED, object=_space("a", 1)),
        Event(type=Event.ADDED, object=_space("b", 2)),
        Event(type=Event.ADDED, object=_space("c", 3)),
        Event(type=Event.SYNCED, revision=9),
    ]
    assert _lines([e for event in second for e in listing.passed_on(event)]) == [
        "MODIFIED b",
        "ADDED c",
        "DELETED d",
        "SYNCED",
    ]
