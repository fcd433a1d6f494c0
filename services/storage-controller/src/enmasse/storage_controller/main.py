"""`enmasse-storage-controller`: wiring and start-up only.

Reads the flags, serves gRPC health (and reflection) on --listen so probes and `enmasse up` can
see it is alive, and runs the `StorageController` against the config service until SIGTERM or
SIGINT. Broker endpoints come from the rendered GitOps output, or from the local runtime's ports
files under --var-dir when given. With --gitops-repo (or $ENMASSE_GITOPS_REPO), the output directory
is a git working copy of that remote and every render that changed files is committed and pushed
(`enmasse.resources.gitops_writeback`), credentials from --git-credentials when its files are there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import structlog
from enmasse.common.certificates import add_tls_dir_argument, tls_dir_files
from enmasse.common.credentials import token_file_source
from enmasse.common.logging import configure_logging
from enmasse.common.metrics import add_metrics_port_flag, serve_service_metrics
from enmasse.common.serving import start_server, until_terminated
from enmasse.common.tracing import configure_service_tracing
from enmasse.resources.discovery import LocalDirectory
from enmasse.resources.gitops_writeback import Credentials, WorkloadRepository
from enmasse.resources.rendered_brokers import GitOpsOutput
from enmasse.storage_controller.controller import StorageController

log = structlog.get_logger("enmasse.storage_controller")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="enmasse-storage-controller",
        description="Places stored addresses onto brokers and renders the broker workloads",
    )
    parser.add_argument(
        "--config",
        "--config-server",
        dest="config",
        default="127.0.0.1:5680",
        help="host:port of the config service",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        help="the file holding this service's config token (else $ENMASSE_TOKEN_FILE; none: "
        "calls go without one, for a config service run without --auth)",
    )
    parser.add_argument(
        "--gitops-dir",
        "--gitops-checkout",
        type=Path,
        required=True,
        help="the GitOps output: broker workloads go to <dir>/workloads/<space>/",
    )
    parser.add_argument("--space", default="", help="reconcile only this address space")
    parser.add_argument(
        "--var-dir",
        type=Path,
        default=None,
        help="the local runtime's state: brokers' ports files under <var>/brokers/",
    )
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port for gRPC health")
    add_metrics_port_flag(parser)
    parser.add_argument("--resync", type=float, default=1.0, help="seconds between retries")
    # Write-back (enmasse.resources.gitops_writeback): with a remote, --gitops-dir is its working
    # copy and every render that changed files is committed and pushed. k8s passes the remote
    # in the env.
    parser.add_argument(
        "--gitops-repo",
        default=os.environ.get("ENMASSE_GITOPS_REPO", ""),
        help="git remote to commit and push the workloads to ($ENMASSE_GITOPS_REPO)",
    )
    parser.add_argument("--gitops-branch", default="main", help="branch of --gitops-repo")
    parser.add_argument("--gitops-path", default="workloads", help="must be 'workloads'")
    parser.add_argument(
        "--git-credentials",
        type=Path,
        default=Path("/etc/enmasse/gitops"),
        help="directory with username and password files (used when both are there)",
    )
    add_tls_dir_argument(parser)
    args = parser.parse_args(argv)
    if args.gitops_path != "workloads":
        parser.error("--gitops-path: only 'workloads' is supported")
    return args


async def serve(args: argparse.Namespace) -> None:
    output = GitOpsOutput(args.gitops_dir)
    tls = tls_dir_files(args.tls_dir)
    controller = StorageController(
        config_target=args.config,
        output=output,
        directory=LocalDirectory(args.var_dir) if args.var_dir is not None else None,
        space=args.space,
        resync_interval=args.resync,
        token=token_file_source(args.token_file),
        tls=tls,
    )
    host, _, port = args.listen.rpartition(":")
    running = await start_server(
        registrations=[], host=host or "127.0.0.1", port=int(port or 0), tls=tls
    )
    log.info("serving", port=running.port, config=args.config, gitops_dir=str(args.gitops_dir))
    metrics_port = serve_service_metrics(listen=args.listen, port=args.metrics_port)
    if metrics_port is not None:
        log.info("metrics served", port=metrics_port)
    writeback = await _start_writeback(args, controller)
    controller.start()
    await until_terminated()
    log.info("stopping")
    await controller.stop()
    if writeback is not None:
        writeback.cancel()
    await running.stop(grace=1.0)


async def _start_writeback(
    args: argparse.Namespace, controller: StorageController
) -> asyncio.Task[None] | None:
    if not args.gitops_repo:
        return None
    repository = WorkloadRepository(
        args.gitops_dir,
        remote=args.gitops_repo,
        author="enmasse-storage-controller",
        branch=args.gitops_branch,
        credentials=Credentials.from_dir(args.git_credentials),
    )
    # Before the controller starts: it rebuilds its placement from the files this may restore.
    await asyncio.to_thread(repository.prepare)
    controller.writeback = repository
    return asyncio.create_task(repository.run(), name="gitops-writeback")


def main(argv: list[str] | None = None) -> None:
    configure_logging(service="storage-controller")
    args = parse_args(argv)
    configure_service_tracing(service="storage-controller", var_dir=args.var_dir)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
