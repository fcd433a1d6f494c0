"""Where one local installation keeps its state, logs and sockets: the var dir.

In: `--var-dir`, else $ENMASSE_VAR, else ./var. Out: the paths every other part of the local
runtime writes and reads, named once: etcd's data, supervisord's config, socket and pid file, the
logs, the ports file, the config service's address, the access tokens (the admin's and one per
control-plane service, mode 0600), the certificates (one directory per holder under <var>/tls,
mode 0700), the GitOps output the controllers render into and the
per-program files of the routers and brokers started from it. Nothing here touches the
disk: a path is only a name until its part makes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from enmasse.cli.client import admin_token_file, tls_root


@dataclass(frozen=True)
class VarDir:
    """Where one local installation keeps its state, logs and sockets."""

    root: Path

    @classmethod
    def choose(cls, option: str | None) -> VarDir:
        raw = option or os.environ.get("ENMASSE_VAR") or "var"
        return cls(Path(raw).expanduser().resolve())

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def supervisord_conf(self) -> Path:
        return self.root / "supervisord.conf"

    @property
    def ports_file(self) -> Path:
        return self.root / "ports.json"

    @property
    def socket(self) -> Path:
        return self.run / "supervisor.sock"

    @property
    def pidfile(self) -> Path:
        return self.run / "supervisord.pid"

    @property
    def config_addr(self) -> Path:
        return self.run / "config.addr"

    @property
    def console_url(self) -> Path:
        """Where the web console writes its URL once it listens (`enmasse-console --url-file`)."""
        return self.run / "console.url"

    @property
    def config_port_file(self) -> Path:
        return self.run / "config.port"

    @property
    def admin_token(self) -> Path:
        """The admin token: config's bootstrap token file, and the CLI's token by default."""
        return admin_token_file(self.root)

    @property
    def tokens(self) -> Path:
        """One token file per control-plane service: <var>/run/tokens/<service>.token."""
        return self.run / "tokens"

    def service_token(self, service: str) -> Path:
        return self.tokens / f"{service}.token"

    @property
    def tls(self) -> Path:
        """The CAs and every holder's certificate: <var>/tls/<holder>/{tls.crt,tls.key,ca.crt}."""
        return tls_root(self.root)

    def tls_dir(self, holder: str) -> Path:
        return self.tls / holder

    @property
    def gitops(self) -> Path:
        """The GitOps output: storage-controller and router-agent render workloads here."""
        return self.root / "gitops"

    @property
    def programs_dir(self) -> Path:
        """One `[program:x]` file per router and broker, included by supervisord.conf."""
        return self.root / "supervisor.d"
