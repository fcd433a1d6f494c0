"""GitOps sync mode of the config service: follow a manifests directory, sync it when it changes.

In: `enmasse-config --manifests-dir DIR`, a directory the k8s `manifests` sidecar keeps up to date
(`<DIR>/<space>/**/*.yaml`), and the service's own Apply, called in-process. Out: every change of
the directory's content applied per space with prune (`enmasse.resources.gitops_sync.sync_tree`,
the same code `enmasse gitops sync` runs over gRPC), and the status written after every attempt.

Reading and hashing the directory run in a worker thread, within the bounds of
`enmasse.resources.manifests`: a tenant's huge or hostile manifests cost that thread bounded time
and memory, never the API every other tenant is calling.

The loop never dies of a failed attempt: the store away or a refused batch is logged, written as
the status, and retried at the next tick; refusals are retried even when nothing changed, since
they may clear on their own (a plan or topic created meanwhile).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog
from enmasse.resources.gitops_sync import (
    DEFAULT_MANAGER,
    ApplyCall,
    OwnedSpacesCall,
    SyncStatus,
    sync_tree,
    tree_revision,
    write_status,
)

log = structlog.get_logger("enmasse.config.gitops_sync")


async def follow_tree(
    root: Path,
    *,
    apply: ApplyCall,
    owned_spaces: OwnedSpacesCall,
    status_path: Path,
    interval: float,
    manager: str = DEFAULT_MANAGER,
) -> None:
    """Syncs `root` whenever its content changes (checked every `interval` seconds), and again
    after a failed attempt; writes the status after every attempt. Runs until cancelled."""
    synced = ""
    while True:
        # Hashing (bounded, but up to MAX_BYTES_PER_READ) stays off the loop that serves the API.
        revision = await asyncio.to_thread(tree_revision, root)
        if revision != synced:
            status = await _attempt(
                root, apply=apply, owned_spaces=owned_spaces, manager=manager, revision=revision
            )
            _publish(status_path, status)
            # refusals may clear without a new revision (a plan or topic created meanwhile)
            if status.ok:
                synced = revision
        await asyncio.sleep(interval)


async def _attempt(
    root: Path,
    *,
    apply: ApplyCall,
    owned_spaces: OwnedSpacesCall,
    manager: str,
    revision: str,
) -> SyncStatus:
    try:
        status = await sync_tree(
            root, apply=apply, owned_spaces=owned_spaces, manager=manager, revision=revision
        )
    except Exception as error:  # the store away, a refused batch: retried at the next tick
        log.warning("gitops sync failed; retrying", root=str(root), error=str(error))
        return SyncStatus(revision=revision, error=str(error) or type(error).__name__)
    log.info(
        "gitops sync done",
        revision=revision,
        applied=status.applied,
        refused=[str(r) for r in status.refused],
    )
    return status


def _publish(path: Path, status: SyncStatus) -> None:
    # A read-only filesystem must not stop the sync: the log line above carries the same facts.
    try:
        write_status(path, status)
    except OSError as error:
        log.warning("cannot write the sync status", path=str(path), error=str(error))
