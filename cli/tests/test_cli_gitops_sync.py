"""`enmasse gitops sync` against a real bare git repository and a real `enmasse-config` process.

A person commits manifests to a clone and pushes; `enmasse gitops sync --once` pulls and applies.
Asserted: what the command prints, what the config service then holds (and who owns it), and
the sync status JSON (revision = the pushed commit, refusals with file:line and reason).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from enmasse.cli.client import ConfigClient
from enmasse.cli.main import cli
from enmasse.resources.kinds import KINDS

from tests.fixtures.config_service import SPACE_QUEUES, ConfigProcess
from tests.fixtures.etcd import EtcdProcess

pytestmark = pytest.mark.slow

SPACE_OWN = {("Address", name): "enmasse-space" for name in SPACE_QUEUES}
"""The space's own queues (its DLQ and MQTT stores), in `held`'s terms."""
SPACE = """apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {name: shop}
spec: {type: standard, plan: standard-small}
"""
KUSTOMIZATION = """apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
"""


def address(name: str, *, plan: str = "standard-small-queue") -> str:
    return (
        "---\napiVersion: enmasse.io/v1\nkind: Address\n"
        f"metadata: {{name: {name}}}\n"
        f"spec: {{address: {name}, type: queue, plan: {plan}}}\n"
    )


class TenantRepo:
    """A bare repository (the remote) and a person's clone of it."""

    def __init__(self, root: Path) -> None:
        self.bare = root / "tenants.git"
        self.work = root / "work"
        self.git("init", "--quiet", "--bare", "--initial-branch=main", str(self.bare), cwd=root)
        self.git("clone", "--quiet", str(self.bare), str(self.work), cwd=root)
        self.git("checkout", "--quiet", "-B", "main")

    def git(self, *args: str, cwd: Path | None = None) -> str:
        done = subprocess.run(
            ["git", "-c", "user.name=Tenant", "-c", "user.email=t@example.invalid", *args],
            cwd=cwd or self.work,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout.strip()

    def commit(self, message: str, *, files: dict[str, str | None]) -> str:
        for name, text in files.items():
            path = self.work / name
            if text is None:
                self.git("rm", "--quiet", name)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            self.git("add", name)
        self.git("commit", "--quiet", "-m", message)
        self.git("push", "--quiet", "origin", "main")
        return self.git("rev-parse", "HEAD")


@pytest.fixture
def server(
    etcd: EtcdProcess, etcd_prefix: str, config_process_factory: Callable[..., ConfigProcess]
) -> str:
    return config_process_factory(etcd_endpoint=etcd.endpoint, prefix=etcd_prefix).target


def sync(server: str, repo: TenantRepo, var: Path) -> tuple[int, str, str, dict]:  # type: ignore[type-arg]
    result = CliRunner().invoke(
        cli,
        [
            *("--server", server, "--var-dir", str(var), "gitops", "sync"),
            *("--repo", str(repo.bare), "--path", "tenants", "--once"),
        ],
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    status = json.loads((var / "gitops" / "sync-status.json").read_text())
    return result.exit_code, result.stdout, result.stderr, status


def held(server: str) -> dict[tuple[str, str], str]:
    """(kind, name) -> manager, for the space shop and its addresses."""
    with ConfigClient(server=server, timeout=10) as client:
        found = {
            ("AddressSpace", r.address_space.metadata.name): r.address_space.metadata.managed_by
            for r in client.list(KINDS["AddressSpace"])
        }
        found.update(
            {
                ("Address", r.address.metadata.name): r.address.metadata.managed_by
                for r in client.list(KINDS["Address"], space="shop")
            }
        )
    return found


def test_commits_are_applied_pruned_and_refused_with_file_and_line(
    server: str, tmp_path: Path
) -> None:
    repo = TenantRepo(tmp_path)
    var = tmp_path / "var"
    head = repo.commit(
        "shop with two queues",
        files={
            "tenants/shop/kustomization.yaml": KUSTOMIZATION,
            "tenants/shop/space.yaml": SPACE,
            "tenants/shop/orders.yaml": address("orders"),
            "tenants/shop/audit.yaml": address("audit"),
        },
    )
    code, out, err, status = sync(server, repo, var)
    assert code == 0, err
    assert out.splitlines() == [
        # files in name order: audit.yaml, orders.yaml, space.yaml
        "shop: address/audit created",
        "shop: address/orders created",
        "shop: addressspace/shop created",
        # the repository declares no DLQ and no MQTT store: the space gets them
        "shop: address/dlq created",
        "shop: address/mqtt-retained created",
        "shop: address/mqtt-wills created",
        "shop: address/mqtt-sessions created",
        f"synced {head[:12]}: created 7",
    ]
    assert status["revision"] == head
    assert held(server) == {
        ("AddressSpace", "shop"): "gitops",
        ("Address", "orders"): "gitops",
        ("Address", "audit"): "gitops",
        **SPACE_OWN,
    }

    # Applied by hand with the CLI: owned by "cli", never pruned by the sync.
    manual = tmp_path / "manual.yaml"
    manual.write_text(address("manual").replace("{name: manual}", "{name: manual, space: shop}"))
    applied = CliRunner().invoke(cli, ["--server", server, "apply", "-f", str(manual)])
    assert applied.exit_code == 0, applied.stderr

    repo.commit("drop audit", files={"tenants/shop/audit.yaml": None})
    code, out, err, status = sync(server, repo, var)
    assert code == 0, err
    assert "shop: address/audit pruned" in out.splitlines()
    assert held(server) == {
        ("AddressSpace", "shop"): "gitops",
        ("Address", "orders"): "gitops",
        ("Address", "manual"): "cli",
        **SPACE_OWN,  # not the sync's to prune
    }

    head = repo.commit(
        "a broken manifest and a good one",
        files={
            "tenants/shop/broken.yaml": "apiVersion: enmasse.io/v1\nkind: Adress\n"
            "metadata: {name: typo}\n",
            "tenants/shop/invoices.yaml": address("invoices"),
        },
    )
    code, out, err, status = sync(server, repo, var)
    assert code == 1
    broken = str(var / "gitops" / "checkout" / "tenants" / "shop" / "broken.yaml")
    assert f"refused: {broken}:2: unknown kind " in err
    assert status["revision"] == head
    assert [(r["file"], r["line"]) for r in status["refused"]] == [(broken, 2)]
    assert 'did you mean "Address"' in status["refused"][0]["reason"]
    assert status["pruning_skipped"] == ["shop"]
    assert held(server) == {
        ("AddressSpace", "shop"): "gitops",
        ("Address", "orders"): "gitops",
        ("Address", "manual"): "cli",
        ("Address", "invoices"): "gitops",
        **SPACE_OWN,
    }


def test_an_unreachable_repository_is_a_clear_error_and_changes_nothing(
    server: str, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere.git"
    result = CliRunner().invoke(
        cli,
        [
            *("--server", server, "--var-dir", str(tmp_path / "var"), "gitops", "sync"),
            *("--repo", str(missing), "--path", "tenants", "--once"),
        ],
    )
    assert result.exit_code == 1
    assert result.stderr.startswith("error: sync failed, nothing applied: git clone failed: ")
    assert "nowhere.git" in result.stderr
    assert held(server) == {}
