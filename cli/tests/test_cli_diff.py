"""`enmasse diff`: the preview of an apply, against a real config process over a real etcd.

The store holds examples/demo-space.yaml; the manifests on disk then add an address, relabel
another, drop a third and name a plan that does not exist. The diff must say exactly that (and
refuse nothing else), change nothing in the store, and agree with what the apply then does.
The pure parts (lines, counts, the spec diff without passwords) are checked without a server.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from enmasse.cli import diff
from enmasse.cli.main import cli
from enmasse.resources.manifests import parse_text
from enmasse.v1 import config_pb2

from tests.fixtures.config_service import ConfigProcess
from tests.fixtures.etcd import EtcdProcess

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-space.yaml"


@pytest.fixture
def server(
    etcd: EtcdProcess, etcd_prefix: str, config_process_factory: Callable[..., ConfigProcess]
) -> str:
    return config_process_factory(etcd_endpoint=etcd.endpoint, prefix=etcd_prefix).target


def enmasse(server: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--server", server, *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def edited_demo(*, with_bad_plan: bool) -> str:
    """demo-space.yaml with `audit` added, `orders` labelled, `events` gone (and a bad plan)."""
    docs = [d for d in yaml.safe_load_all(DEMO.read_text()) if d["metadata"]["name"] != "events"]
    for doc in docs:
        if doc["metadata"]["name"] == "orders":
            doc["metadata"]["labels"] = {"team": "web"}
    docs.append(
        {
            "apiVersion": "enmasse.io/v1",
            "kind": "Address",
            "metadata": {"name": "audit", "space": "demo"},
            "spec": {"address": "audit", "type": "queue", "plan": "standard-small-queue"},
        }
    )
    if with_bad_plan:
        docs.append(
            {
                "apiVersion": "enmasse.io/v1",
                "kind": "Address",
                "metadata": {"name": "gold", "space": "demo"},
                "spec": {"address": "gold", "type": "queue", "plan": "gold-queue"},
            }
        )
    return yaml.safe_dump_all(docs, sort_keys=False)


def test_diff_previews_the_apply_and_changes_nothing(server: str, tmp_path: Path) -> None:
    assert enmasse(server, "apply", "-f", str(DEMO))[0] == 0
    _, stored_before, _ = enmasse(server, "get", "addresses", "-s", "demo", "-o", "yaml")
    manifests = tmp_path / "demo.yaml"
    manifests.write_text(edited_demo(with_bad_plan=True))

    code, out, err = enmasse(server, "diff", "-f", str(manifests), "--prune")

    assert (code, err) == (1, "")
    assert out.splitlines() == [
        "~ address/orders (space demo) would change",
        "    --- live",
        "    +++ manifests",
        "    @@ -1,3 +1,6 @@",
        "    +metadata:",
        "    +  labels:",
        "    +    team: web",
        "     spec:",
        "       address: orders",
        "       plan: standard-small-queue",
        "+ address/audit (space demo) would be created",
        "! address/gold (space demo) would be refused: Address demo/gold: spec.plan: "
        "address plan 'gold-queue' not found",
        "- address/events (space demo) would be pruned",
        "1 to create, 1 to change, 1 to prune, 1 refused, 5 unchanged",
    ]
    _, stored_after, _ = enmasse(server, "get", "addresses", "-s", "demo", "-o", "yaml")
    assert stored_after == stored_before  # a preview writes nothing

    # Without the bad address, the diff and then the apply itself say the same thing.
    manifests.write_text(edited_demo(with_bad_plan=False))
    code, out, _ = enmasse(server, "diff", "-f", str(manifests), "--prune")
    assert code == 0
    assert [line for line in out.splitlines() if not line.startswith("    ")] == [
        "~ address/orders (space demo) would change",
        "+ address/audit (space demo) would be created",
        "- address/events (space demo) would be pruned",
        "1 to create, 1 to change, 1 to prune, 0 refused, 5 unchanged",
    ]
    code, out, _ = enmasse(server, "apply", "-f", str(manifests), "--prune")
    assert code == 0
    assert sorted(line for line in out.splitlines() if "unchanged" not in line) == [
        "address/audit created",
        "address/events pruned",
        "address/orders configured",
    ]
    code, out, _ = enmasse(server, "diff", "-f", str(manifests), "--prune")
    assert (code, out) == (0, "0 to create, 0 to change, 0 to prune, 0 refused, 7 unchanged\n")


def test_diff_of_a_broken_file_names_it_and_asks_nothing(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("apiVersion: enmasse.io/v1\nkind: Adress\n")
    # No server runs at this address: a bad file must be reported before any call is made.
    code, out, err = enmasse("127.0.0.1:1", "diff", "-f", str(tmp_path))
    assert (code, out) == (1, "")
    assert f'{tmp_path / "bad.yaml"}:2: unknown kind "Adress"' in err
    assert err.endswith("error: 1 bad manifest(s): nothing compared\n")


# ---------------------------------------------------------------- pure parts


def result(
    action: config_pb2.ApplyResult.Action,
    *,
    kind: str = "Address",
    space: str = "demo",
    name: str = "orders",
) -> config_pb2.ApplyResult:
    return config_pb2.ApplyResult(
        kind=kind, ref=config_pb2.ObjectRef(space=space, name=name), action=action
    )


def test_change_lines_and_counts() -> None:
    Action = config_pb2.ApplyResult
    refused = result(Action.REFUSED, name="gold")
    refused.message = "spec.plan: address plan 'gold-queue' not found"
    results = [
        result(Action.CREATED),
        result(Action.UNCHANGED, kind="AddressSpace", space="", name="demo"),
        result(Action.PRUNED, kind="AddressPlan", space="", name="old"),
        refused,
    ]
    assert [diff.change_line(r) for r in results] == [
        "+ address/orders (space demo) would be created",
        None,
        "- addressplan/old would be pruned",
        "! address/gold (space demo) would be refused: "
        "spec.plan: address plan 'gold-queue' not found",
    ]
    assert diff.summary_line(results) == (
        "1 to create, 0 to change, 1 to prune, 1 refused, 1 unchanged"
    )


def test_spec_diff_never_shows_a_password() -> None:
    user = """\
apiVersion: enmasse.io/v1
kind: MessagingUser
metadata: {name: app, space: demo}
spec:
  username: app
  password: s3cret-one
  authorization: [{addresses: ["*"], operations: [send]}]
"""
    (live,) = [m.resource for m in parse_text(user, file="u.yaml").manifests]
    live.messaging_user.spec.password = ""
    live.messaging_user.spec.password_hash = "scrypt$16384$8$1$c2FsdA==$aGFzaA=="
    changed = user.replace("s3cret-one", "s3cret-two").replace("[send]", "[send, recv]")
    (desired,) = [m.resource for m in parse_text(changed, file="u.yaml").manifests]
    lines = diff.spec_diff(live, desired)
    assert [line for line in lines if line[:1] in "+-"] == [
        "--- live",
        "+++ manifests",
        "+    - recv",
    ]
    assert not any("s3cret" in line or "scrypt" in line for line in lines)
