"""Write-back: rendered workloads, committed to a git repository and pushed.

In: a GitOps output directory a control-plane service renders into
(`<dir>/workloads/<space>/*.yaml`: the storage-controller its brokers, the router-agent its
routers), the reasons of each render that changed files ("add broker shop-broker-1 for address
shop/orders (plan standard-large-queue)", "space shop: 2 routers (plan standard-small: min 2)"),
a remote URL and a branch, and optional credentials from a mounted secret directory
(`<dir>/username`, `<dir>/password`). Out: one commit per batch of renders, whose message is
those reasons, by the service that rendered them, pushed to the remote, where Argo CD (or
`enmasse gitops sync`) picks it up.

The output directory itself is the working copy: `prepare` makes it one (init, remote, fetch)
without touching the files the service already rendered, and fills an empty one from the remote
(a restarted pod with an emptyDir gets its rendered workloads, hence its placement and ports, back).
Only `workloads/` is ever staged. Each service has a working copy of its own (its pod's emptyDir):
two services pushing to one branch meet as a rejected push, which is rebased onto the remote and
pushed again, a bounded number of times; a commit that still cannot be pushed stays local and goes
with the next one. Each touches only its own files, so the rebase never conflicts.

Git is the `git` command, run in a worker thread (`asyncio.to_thread`) so a reconcile loop never
waits on the network. The password never appears on a command line: it travels as an HTTP header
in git's environment (GIT_CONFIG_*), read only by the git child.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog
from enmasse.resources.workload_files import WORKLOADS

log = structlog.get_logger("enmasse.resources.gitops_writeback")
GIT_TIMEOUT = 60.0
PUSH_ATTEMPTS = 3


class GitFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    @classmethod
    def from_dir(cls, directory: Path | None) -> Credentials | None:
        """The mounted secret's `username` and `password` files, when both are there."""
        if directory is None:
            return None
        user, password = directory / "username", directory / "password"
        if not (user.is_file() and password.is_file()):
            return None
        return cls(user.read_text().strip(), password.read_text().strip())

    def git_environment(self) -> dict[str, str]:
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return {
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "http.extraHeader",
            "GIT_CONFIG_VALUE_0": f"Authorization: Basic {token}",
        }


def commit_message(reasons: Sequence[str]) -> str:
    """The first reason as the subject (git log --oneline shows it); all of them in the body."""
    unique = list(dict.fromkeys(reasons)) or ["render workloads"]
    subject = unique[0] if len(unique) == 1 else f"{unique[0]} (+{len(unique) - 1} more)"
    return subject + "\n\n" + "\n".join(f"- {reason}" for reason in unique) + "\n"


# ---------------------------------------------------------------- the repository


class WorkloadRepository:
    """The GitOps output directory as a git working copy of `remote`, branch `branch`."""

    def __init__(
        self,
        root: Path,
        *,
        remote: str,
        author: str,
        branch: str = "main",
        credentials: Credentials | None = None,
    ) -> None:
        self.root = Path(root)
        # The service that renders, as the commits' author: `git log` says who changed what.
        self.author = (author, f"{author.removeprefix('enmasse-')}@enmasse.invalid")
        self.remote = remote
        self.branch = branch
        self.credentials = credentials
        self._reasons: list[str] = []
        self._wake = asyncio.Event()
        self.commits = 0

    # -------------------------------------------------------- git

    def git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
        if self.credentials is not None:
            env.update(self.credentials.git_environment())
        done = subprocess.run(
            ["git", *args],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT,
            check=False,
        )
        if check and done.returncode != 0:
            raise GitFailed(f"git {' '.join(args[:2])}: {done.stderr.strip()}")
        return done

    def prepare(self) -> None:
        """A working copy of the remote around what is already rendered here."""
        self.root.mkdir(parents=True, exist_ok=True)
        fresh = not any((self.root / WORKLOADS).rglob("*.yaml"))
        if not (self.root / ".git").exists():
            self.git("init", "--quiet", "--initial-branch", self.branch)
            self.git("remote", "add", "origin", self.remote)
        else:
            self.git("remote", "set-url", "origin", self.remote)
        self.git("fetch", "--quiet", "origin")
        tracking = f"refs/remotes/origin/{self.branch}"
        if self.git("rev-parse", "--verify", "--quiet", tracking, check=False).returncode == 0:
            self.git("reset", "--quiet", tracking)  # index and HEAD only: files stay
            if fresh:
                self.git("checkout", "--", ".")
        log.info("gitops working copy ready", root=str(self.root), branch=self.branch)

    def commit_and_push(self, message: str) -> str | None:
        """Commits what changed under workloads/ (None when nothing did) and pushes."""
        self.git("add", "--all", "--", WORKLOADS)
        if self.git("diff", "--cached", "--quiet", check=False).returncode == 0:
            self._push_pending()
            return None
        name, email = self.author
        self.git(
            "-c", f"user.name={name}", "-c", f"user.email={email}",
            "commit", "--quiet", "-m", message,
        )  # fmt: skip
        commit = self.git("rev-parse", "HEAD").stdout.strip()
        self.commits += 1
        log.info("workloads committed", commit=commit[:12], subject=message.splitlines()[0])
        self._push_pending()
        return commit

    def _push_pending(self) -> None:
        for attempt in range(1, PUSH_ATTEMPTS + 1):
            pushed = self.git(
                "push", "--quiet", "origin", f"HEAD:refs/heads/{self.branch}", check=False
            )
            if pushed.returncode == 0:
                return
            log.warning("push rejected; rebasing", attempt=attempt, error=pushed.stderr.strip())
            self.git("fetch", "--quiet", "origin", self.branch, check=False)
            name, email = self.author
            rebased = self.git(
                "-c", f"user.name={name}", "-c", f"user.email={email}",
                "rebase", "--quiet", f"origin/{self.branch}", check=False,
            )  # fmt: skip
            if rebased.returncode != 0:
                self.git("rebase", "--abort", check=False)
                break
        log.error("workloads not pushed; retried with the next change", remote=self.remote)

    # -------------------------------------------------------- the rendering service's side

    def note(self, reasons: Sequence[str]) -> None:
        """Called after a render changed files: commit soon, with these reasons."""
        if reasons:
            self._reasons.extend(reasons)
            self._wake.set()

    async def run(self) -> None:
        """Commits and pushes the noted changes until cancelled (call `prepare` first, before
        the service reads the output); git failures are logged and retried with the next
        change."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            reasons, self._reasons = self._reasons, []
            try:
                await asyncio.to_thread(self.commit_and_push, commit_message(reasons))
            except (GitFailed, OSError, subprocess.TimeoutExpired) as error:
                log.error("write-back failed", error=str(error))
                self._reasons = reasons + self._reasons
