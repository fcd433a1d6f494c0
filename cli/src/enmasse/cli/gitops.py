"""`enmasse gitops sync`: Argo CD + config's sync, on one machine.

In: a git repository (any URL git understands: a path, file://, https://) and a path inside it
that holds one directory per address space (`k8s/tenants`, laid out as `<space>/**/*.yaml`).
Out: the repository checked out under `<var-dir>/gitops/checkout` at the branch's head, the
spaces applied with prune through the config service's Apply (manager "gitops"), one line per
object changed or refused (refusals with `file:line`), and the sync status as JSON beside the
checkout (`<var-dir>/gitops/sync-status.json`).

The apply itself is `enmasse.resources.gitops_sync.sync_tree`, the same code `enmasse-config
--manifests-dir` runs in a cluster, here driven through the CLI's gRPC client. Git is the `git`
command (2.x): the checkout is the tool's own, so it is fetched and reset hard to the remote's
head, never merged. It calls with the least-privilege `gitops` token `enmasse up` made
(<var-dir>/run/tokens/gitops.token) unless --token or $ENMASSE_TOKEN names another.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import click
from enmasse.cli.client import CliError, ConfigClient
from enmasse.cli.progress import Reporter, open_progress, quiet_option
from enmasse.resources.gitops_sync import (
    DEFAULT_MANAGER,
    SyncStatus,
    owned_spaces_of,
    result_line,
    sync_tree,
    write_status,
)
from enmasse.resources.kinds import KINDS, key_of
from enmasse.v1 import config_pb2

GIT_TIMEOUT = 120.0
Echo = Callable[..., None]
"""How a line goes out: click.echo, or the progress display's echo (`err=True`: stderr)."""
OWNED_KINDS = ("AddressSpace", "Address", "MessagingUser")


class _Settings(Protocol):
    timeout: float

    @property
    def var(self) -> object: ...

    def client(self, *, service: str = "") -> ConfigClient: ...


class GitError(CliError):
    pass


def git(*args: str, cwd: Path | None = None) -> str:
    """One git command; its stderr becomes the error the user sees."""
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise GitError(f"git {args[0]}: {error}") from None
    if done.returncode != 0:
        raise GitError(f"git {args[0]} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


def checkout_head(*, repo: str, branch: str, checkout: Path) -> str:
    """The checkout at the remote branch's head (cloned on first use); returns the commit id."""
    if not (checkout / ".git").is_dir():
        checkout.parent.mkdir(parents=True, exist_ok=True)
        git("clone", "--quiet", "--branch", branch, "--single-branch", repo, str(checkout))
    else:
        git("remote", "set-url", "origin", repo, cwd=checkout)
        git("fetch", "--quiet", "origin", branch, cwd=checkout)
        git("reset", "--quiet", "--hard", "FETCH_HEAD", cwd=checkout)
        git("clean", "--quiet", "-fdx", cwd=checkout)
    return git("rev-parse", "HEAD", cwd=checkout)


def sync_once(
    client: ConfigClient,
    *,
    root: Path,
    revision: str,
    manager: str,
    echo: bool = True,
    say: Echo = click.echo,
) -> SyncStatus:
    async def apply(request: config_pb2.ApplyRequest) -> config_pb2.ApplyResponse:
        return client.apply(
            space=request.space,
            resources=list(request.resources),
            manager=request.manager,
            prune=request.prune,
            atomic=request.atomic,
        )

    async def owned_spaces(owner: str) -> set[str]:
        objects = [
            (key_of(resource), getattr(resource, KINDS[kind].field))
            for kind in OWNED_KINDS
            for resource in client.list(KINDS[kind])
        ]
        return owned_spaces_of(objects, manager=owner)

    def report(space: str, result: config_pb2.ApplyResult) -> None:
        if echo and result.action != config_pb2.ApplyResult.UNCHANGED:
            say(result_line(space, result))

    return asyncio.run(
        sync_tree(
            root,
            apply=apply,
            owned_spaces=owned_spaces,
            manager=manager,
            revision=revision,
            on_result=report,
        )
    )


def echo_summary(status: SyncStatus, *, say: Echo = click.echo) -> None:
    if status.error:
        say(f"error: sync failed, nothing applied: {status.error}", err=True)
        return
    counts = ", ".join(f"{name.lower()} {n}" for name, n in sorted(status.applied.items()))
    say(f"synced {status.revision[:12]}: {counts or 'nothing'}")
    for refusal in status.refused:
        say(f"refused: {refusal}", err=True)
    for space in status.pruning_skipped:
        say(f"{space}: not pruned: some of its files could not be read", err=True)


@click.group()
def gitops() -> None:
    """GitOps on this machine: what Argo CD and config's sync do in a cluster."""


@gitops.command()
@click.option("--repo", required=True, metavar="URL", help="git repository (path or URL)")
@click.option(
    "--path",
    "subpath",
    default=".",
    show_default=True,
    metavar="DIR",
    help="directory in the repository holding one folder per address space",
)
@click.option("--branch", default="main", show_default=True)
@click.option("--interval", type=float, default=10.0, show_default=True, help="seconds")
@click.option("--once", is_flag=True, help="sync once and exit (1 when anything was refused)")
@click.option("--manager", default=DEFAULT_MANAGER, show_default=True)
@click.option("--checkout", type=click.Path(path_type=Path), help="[<var-dir>/gitops/checkout]")
@click.option("--status-file", type=click.Path(path_type=Path), help="[<var-dir>/gitops/...]")
@click.option("--max-rounds", type=int, default=0, hidden=True, help="stop after N (tests)")
@quiet_option
@click.pass_obj
def sync(
    settings: _Settings,
    repo: str,
    subpath: str,
    branch: str,
    interval: float,
    once: bool,
    manager: str,
    checkout: Path | None,
    status_file: Path | None,
    max_rounds: int,
    quiet: bool,
) -> None:
    """Pull REPO and apply DIR/<space>/*.yaml with prune, per space; then every --interval."""
    var_root: Path = settings.var.root  # type: ignore[attr-defined]
    checkout = checkout or var_root / "gitops" / "checkout"
    status_file = status_file or checkout.parent / "sync-status.json"
    applied = ""
    rounds = 0
    # On a terminal, the live display shows the step of the moment; a loop that runs for days
    # leaves no line per pull behind (only a failed step's).
    with (
        settings.client(service="gitops") as client,  # the `gitops` token `up` made, if any
        open_progress("gitops", quiet=quiet, plain_steps=False, keep_done=once) as reporter,
    ):
        while True:
            rounds += 1
            status = _round(
                client,
                repo=repo,
                branch=branch,
                checkout=checkout,
                subpath=subpath,
                manager=manager,
                skip=applied,
                reporter=reporter,
            )
            if status is not None:
                write_status(status_file, status)
                echo_summary(status, say=reporter.echo)
                applied = status.revision if status.ok else ""
                if once:
                    raise SystemExit(0 if status.ok else 1)
            if max_rounds and rounds >= max_rounds:
                return
            reporter.step(f"next pull in {interval:g} s")
            time.sleep(interval)


def _round(
    client: ConfigClient,
    *,
    repo: str,
    branch: str,
    checkout: Path,
    subpath: str,
    manager: str,
    skip: str,
    reporter: Reporter,
) -> SyncStatus | None:
    """One pull and, when the head moved (or the last sync was not clean), one apply."""
    try:
        reporter.step(f"pulling {repo} ({branch})")
        head = checkout_head(repo=repo, branch=branch, checkout=checkout)
        if head == skip:
            return None
        root = (checkout / subpath).resolve()
        if checkout.resolve() not in (root, *root.parents):
            raise CliError(f"--path {subpath} leads outside the repository")
        reporter.step(f"applying {subpath} at {head[:12]} with prune")
        return sync_once(client, root=root, revision=head, manager=manager, say=reporter.echo)
    except CliError as error:
        return SyncStatus(revision=skip or "unknown", error=error.message)
