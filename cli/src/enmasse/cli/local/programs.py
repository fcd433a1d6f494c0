"""What runs: the control plane's programs and the supervisord config that runs them.

In: the var dir and the chosen `Ports`. Out: one command line per control-plane program
(`program_commands`: etcd, config, storage-controller, router-agent, subscription, `runtime` and
the web console, in start order), a `[program:x]` section per program (`program_section`, the
routers' and brokers' too, which the runtime writes into <var>/supervisor.d/) and the whole
<var>/supervisord.conf (`render_supervisord_conf`). Pure: text out, nothing started; the tests
read the rendered config directly.

Every program is one of the workspace's console scripts (`enmasse-config`, ...) or /usr/bin/etcd,
started as a process: the CLI never imports a service. Each restarts on a crash with
supervisord's back-off, stops with its whole process group, logs to <var>/log/<name>.log and gets
ENMASSE_VAR (traces go to <var>/traces).

Access: config runs with auth on, its bootstrap token being the admin token `up` wrote to
<var>/run/admin-token; each controller reads its own least-privilege token from
<var>/run/tokens/<service>.token (`--token-file`), which `up` creates once config answers
(local/tokens.py). The runtime program never calls config and has no token.

Transport: every gRPC port speaks mutual TLS with the certificates `up` made in <var>/tls
(local/tls.py): each service gets `--tls-dir=<var>/tls/<service>`, config also
`--etcd-tls-dir` for its client certificate of etcd's own CA, and etcd serves https only to
certificates of that CA (`--client-cert-auth`). Routers and brokers get theirs through
$ENMASSE_TLS_DIR in their environment (`program_section`'s `environment`).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from enmasse.cli.client import OPERATOR_HOLDER, CliError
from enmasse.cli.local.gateways import store_password_file
from enmasse.cli.local.ports import Ports
from enmasse.cli.local.tls import CONFIG_ETCD, ETCD
from enmasse.cli.local.var_dir import VarDir
from enmasse.common.certificates import CA_FILE, TlsFiles

ETCD_BINARY = "/usr/bin/etcd"
# The control plane, in start order: what `up` starts and waits for. Routers and brokers are not
# here: the `runtime` program adds and removes them as the GitOps output says (runtime.py).
PROGRAMS = (
    "etcd",
    "config",
    "storage-controller",
    "router-agent",
    "subscription",
    "runtime",
    "console",
)


def installed_program(name: str) -> str:
    """The path of a console script beside this Python (the workspace venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise CliError(f"cannot find the `{name}` program (run `uv sync`)")
    return found


def program_commands(*, var: VarDir, ports: Ports) -> dict[str, list[str]]:
    peer = f"http://127.0.0.1:{ports.etcd_peer}"  # one member: nobody else ever connects
    client = f"https://127.0.0.1:{ports.etcd_client}"
    config = f"127.0.0.1:{ports.config}"
    etcd = TlsFiles(var.tls_dir(ETCD))
    return {
        "etcd": [
            ETCD_BINARY,
            "--name=enmasse",
            f"--data-dir={var.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=enmasse={peer}",
            f"--cert-file={etcd.cert}",
            f"--key-file={etcd.key}",
            f"--trusted-ca-file={etcd.ca}",
            "--client-cert-auth",
        ],
        "config": [
            installed_program("enmasse-config"),
            f"--listen=127.0.0.1:{ports.config}",
            f"--port-file={var.config_port_file}",
            f"--etcd=127.0.0.1:{ports.etcd_client}",
            f"--bootstrap-token-file={var.admin_token}",
            f"--tls-dir={var.tls_dir('config')}",
            f"--etcd-tls-dir={var.tls_dir(CONFIG_ETCD)}",
        ],
        "storage-controller": [
            installed_program("enmasse-storage-controller"),
            f"--listen=127.0.0.1:{ports.storage_controller}",
            f"--config={config}",
            f"--gitops-dir={var.gitops}",
            f"--var-dir={var.root}",
            f"--token-file={var.service_token('storage-controller')}",
            f"--tls-dir={var.tls_dir('storage-controller')}",
        ],
        "router-agent": [
            installed_program("enmasse-router-agent"),
            f"--listen=127.0.0.1:{ports.router_agent}",
            f"--config={config}",
            f"--var={var.root}",
            f"--gitops-dir={var.gitops}",
            f"--token-file={var.service_token('router-agent')}",
            f"--tls-dir={var.tls_dir('router-agent')}",
            f"--mqtt-store-password-file={store_password_file(var)}",
        ],
        "subscription": [
            installed_program("enmasse-subscription"),
            f"--listen=127.0.0.1:{ports.subscription}",
            f"--config={config}",
            f"--var={var.root}",
            f"--token-file={var.service_token('subscription')}",
            f"--tls-dir={var.tls_dir('subscription')}",
        ],
        # Rendered router and broker workloads -> supervisor programs, for as long as we run.
        "runtime": [installed_program("enmasse"), f"--var-dir={var.root}", "runtime", "reconcile"],
        # The web console: a client of config like the CLI (TLS verified against the published
        # CA, the logged-in user's token on each call); plain HTTP on loopback only. Its live
        # figures: the routers and brokers found under the var dir, asked with the operator's
        # read-only certificate, for the spaces a user's token may see.
        "console": [
            installed_program("enmasse-console"),
            f"--listen=127.0.0.1:{ports.console}",
            f"--config={config}",
            f"--ca-file={var.tls / CA_FILE}",
            f"--url-file={var.console_url}",
            f"--var-dir={var.root}",
            f"--operator-tls-dir={var.tls_dir(OPERATOR_HOLDER)}",
        ],
    }


def _ini(value: object) -> str:
    return str(value).replace("%", "%%")  # supervisord expands %(name)s in values


def program_section(
    *,
    name: str,
    command: Sequence[str],
    var: VarDir,
    priority: int,
    environment: Mapping[str, str] | None = None,
) -> str:
    """One `[program:x]`: restarted on crash with supervisord's back-off (1 s, 2 s, ...; FATAL
    after 10 tries), stopped with its whole process group, logging to <var>/log/<name>.log,
    with PYTHONUNBUFFERED, ENMASSE_VAR and `environment` in its environment."""
    variables = {"PYTHONUNBUFFERED": "1", "ENMASSE_VAR": str(var.root), **(environment or {})}
    pairs = ",".join(f'{key}="{_ini(value)}"' for key, value in variables.items())
    return (
        f"[program:{name}]\n"
        f"command = {_ini(' '.join(command))}\n"
        f"priority = {priority}\n"
        "autostart = true\n"
        "autorestart = true\n"
        "startsecs = 1\n"
        "startretries = 10\n"
        "stopsignal = TERM\n"
        "stopwaitsecs = 10\n"
        "stopasgroup = true\n"
        "killasgroup = true\n"
        "redirect_stderr = true\n"
        f"stdout_logfile = {_ini(var.log / (name + '.log'))}\n"
        "stdout_logfile_maxbytes = 10MB\n"
        "stdout_logfile_backups = 2\n"
        f"environment = {pairs}\n"
    )


def render_supervisord_conf(*, var: VarDir, commands: dict[str, list[str]]) -> str:
    sections = [
        f"[unix_http_server]\nfile = {_ini(var.socket)}\nchmod = 0700\n",
        "[supervisord]\n"
        f"logfile = {_ini(var.log / 'supervisord.log')}\n"
        f"pidfile = {_ini(var.pidfile)}\n"
        f"childlogdir = {_ini(var.log)}\n"
        f"directory = {_ini(var.root)}\n"
        "identifier = enmasse\n"
        "nodaemon = false\n",
        "[rpcinterface:supervisor]\n"
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n",
        f"[supervisorctl]\nserverurl = unix://{_ini(var.socket)}\n",
        # Routers and brokers: added and removed live by the runtime (reloadConfig + add/remove).
        f"[include]\nfiles = {_ini(var.programs_dir)}/*.conf\n",
    ]
    for priority, (name, command) in enumerate(commands.items(), start=1):
        section = program_section(name=name, command=command, var=var, priority=priority * 10)
        sections.append(section)
    return "\n".join(sections)
