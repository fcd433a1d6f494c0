"""RabbitMQ (Debian's `rabbitmq-server`, AMQP 1.0 plugin) as a throwaway peer for comparisons.

What flows in: a wish for a RabbitMQ node. What flows out: (host, port) of its AMQP listener,
driven by the SAME engine clients as our own broker and router, so figures compare like for like.

How it runs: everything lives in a temp dir (mnesia, logs, config, enabled_plugins, HOME for the
Erlang cookie), on free loopback ports (AMQP, distribution, epmd). We start our own epmd on its
own port first, in the foreground, so we know its PID; then the server in a new session (its
shell script, beam.smp and Erlang's helpers form one process group, all started by us). Stopping
sends SIGTERM to that group (SIGKILL after 20 s), then to our epmd, by PID: nothing else on the
machine is touched. If the package is missing, `ensure_installed` installs it with apt-get, with
a temporary policy-rc.d so that Debian's post-install does not start a system-wide node.

Addresses: the 3.10 plugin maps `/queue/<name>` to a queue it declares on attach.

TLS (`rabbitmq(tls=files)`): an ssl listener on a free port of its own (`node.tls_port`), with
the certificate, key and CA of a `TlsFiles` directory (`enmasse.common.certificates`); clients
are not asked for a certificate. The AMQP 1.0 plugin serves that listener too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from enmasse.amqp.client import Client
from enmasse.common.certificates import TlsFiles

from bench.harness import Context, Table, latency_table, suite, throughput_table

SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
POLICY_RC = Path("/usr/sbin/policy-rc.d")
USER, PASSWORD = "guest", "guest"


class RabbitMQUnavailable(RuntimeError):
    """RabbitMQ cannot run here; the message says why."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure_installed() -> None:
    """Installs Debian's rabbitmq-server (with the AMQP 1.0 plugin) if it is not there."""
    if SERVER.exists():
        return
    if os.geteuid() != 0:
        raise RabbitMQUnavailable("rabbitmq-server is not installed and we are not root")
    guard = not POLICY_RC.exists()
    if guard:
        # Exit code 101 tells invoke-rc.d "not allowed": the package installs without starting.
        POLICY_RC.write_text("#!/bin/sh\nexit 101\n")
        POLICY_RC.chmod(0o755)
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        result = subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "rabbitmq-server"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        if guard:
            POLICY_RC.unlink(missing_ok=True)
    if result.returncode != 0 or not SERVER.exists():
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise RabbitMQUnavailable(f"apt-get install rabbitmq-server failed: {' / '.join(tail)}")


def _epmd_binary() -> str:
    found = shutil.which("epmd")
    if found:
        return found
    candidates = sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))
    if not candidates:
        raise RabbitMQUnavailable("no epmd binary (erlang-base) found")
    return str(candidates[-1])


class RabbitMQNode:
    """One throwaway node. start() blocks until it accepts AMQP 1.0; stop() ends what it started."""

    def __init__(self, workdir: Path, *, tls: TlsFiles | None = None) -> None:
        self.workdir = workdir
        self.host = "127.0.0.1"
        self.port = _free_port()
        self.tls = tls
        self.tls_port = _free_port() if tls is not None else 0
        self.epmd_port = _free_port()
        self.dist_port = _free_port()
        self.server: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The Erlang VM's PID (beam.smp), as RabbitMQ wrote it: where the broker's CPU goes."""
        try:
            return int((self.workdir / "rabbit.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def _environment(self) -> dict[str, str]:
        base = self.workdir
        return {
            **os.environ,
            "HOME": str(base),
            "RABBITMQ_NODENAME": f"bench{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": self.host,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": self.host,
            # A node that dies writes its crash dump here, not into the caller's working directory.
            "ERL_CRASH_DUMP": str(base / "erl_crash.dump"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_LOGS": str(base / "log" / "rabbit.log"),
            "RABBITMQ_PID_FILE": str(base / "rabbit.pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
        }

    def start(self, *, timeout: float = 90.0) -> None:
        ensure_installed()
        base = self.workdir
        (base / "log").mkdir(parents=True, exist_ok=True)
        (base / "enabled_plugins").write_text("[rabbitmq_amqp1_0].\n")
        (base / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {self.host}:{self.port}\n"
            "loopback_users = none\n"
            f"amqp1_0.default_user = {USER}\n" + self._tls_config()
        )
        (base / "advanced.config").write_text("[].\n")
        env = self._environment()
        self.epmd = subprocess.Popen(
            [_epmd_binary(), "-port", str(self.epmd_port), "-address", self.host],
            env=env,
            cwd=base,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with open(base / "server.out", "ab") as out:
            self.server = subprocess.Popen(
                [str(SERVER)],
                env=env,
                cwd=base,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _tls_config(self) -> str:
        if self.tls is None:
            return ""
        return (
            f"listeners.ssl.default = {self.host}:{self.tls_port}\n"
            f"ssl_options.cacertfile = {self.tls.ca}\n"
            f"ssl_options.certfile = {self.tls.cert}\n"
            f"ssl_options.keyfile = {self.tls.key}\n"
            "ssl_options.verify = verify_none\n"
            "ssl_options.fail_if_no_peer_cert = false\n"
        )

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            assert self.server is not None
            if self.server.poll() is not None:
                log = (self.workdir / "server.out").read_text(errors="replace")[-2000:]
                raise RabbitMQUnavailable(
                    f"rabbitmq-server exited ({self.server.returncode}): {log}"
                )
            try:
                with Client(self.host, self.port, user=USER, password=PASSWORD, timeout=5):
                    return
            except Exception as err:  # not listening yet, or the plugin still starting
                last_error = str(err)
                time.sleep(0.5)
        raise RabbitMQUnavailable(f"rabbitmq-server not ready in {timeout:.0f} s: {last_error}")

    def stop(self) -> None:
        """SIGTERM to the server's process group (all ours), SIGKILL if it lingers; then epmd."""
        server, self.server = self.server, None
        if server is not None and server.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.pid, signal.SIGKILL)
                server.wait(5)
        if server is not None:
            # Erlang helpers (erl_child_setup, inet_gethost) share the group: make sure they went.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server.pid, signal.SIGKILL)
        epmd, self.epmd = self.epmd, None
        if epmd is not None and epmd.poll() is None:
            epmd.terminate()
            try:
                epmd.wait(5)
            except subprocess.TimeoutExpired:
                epmd.kill()
                epmd.wait(5)


@contextlib.contextmanager
def rabbitmq(*, tls: TlsFiles | None = None) -> Iterator[RabbitMQNode]:
    """A running throwaway node in a temp dir, stopped and removed on exit; with `tls`, an ssl
    listener too (`node.tls_port`)."""
    with tempfile.TemporaryDirectory(prefix="bench-rabbitmq-") as tmp:
        node = RabbitMQNode(Path(tmp), tls=tls)
        node.start()
        try:
            yield node
        finally:
            node.stop()


@suite("rabbitmq", "RabbitMQ 3.10 AMQP 1.0 plugin, one queue per pair, same clients")
def rabbitmq_suite(ctx: Context) -> Iterator[Table]:
    with rabbitmq() as node:
        yield throughput_table(
            ctx,
            "RabbitMQ queue (AMQP 1.0 plugin), non-durable messages",
            host=node.host,
            port=node.port,
            # RabbitMQ keeps queues and what a run left in them: fresh queues for every run.
            address=lambda run: [f"/queue/bench-{run}-{i}" for i in range(4)],
            messages=100_000,
            user=USER,
            password=PASSWORD,
            peer_pid=node.pid,
        )
        yield latency_table(
            ctx,
            "RabbitMQ queue latency",
            host=node.host,
            port=node.port,
            address="/queue/bench-latency",
            user=USER,
            password=PASSWORD,
        )
