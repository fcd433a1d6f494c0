"""The certificates of a local installation: mutual TLS between every process `enmasse up` runs.

In: the var dir. Out: <var>/tls/ (mode 0700) holding two CAs and one directory per holder in
cert-manager's Secret layout (`tls.crt`, `tls.key` mode 0600, `ca.crt`), made before any program
starts (`ensure_certificates`):

- `ca/`: the CA every gRPC port trusts; it signs `config`, `storage-controller`, `router-agent`,
  `subscription` and `admin` (the CLI) as `control-plane`, `router` (every router: its
  RouterAdmin port) as `data-plane`, and `broker` (every broker: BrokerAdmin, and the drain
  call one broker makes on another) as `broker`;
- `etcd-ca/`: etcd's own CA, which signs etcd's server certificate (`etcd`) and the one client
  certificate that opens it (`config-etcd`): no other process can reach the store.

Why routers (and brokers) share one certificate: RouterAdmin tells its callers apart by role
alone, and a router or broker the runtime starts later needs no CA key to get going; the
certificate names the role, its holders are all the same kind of process on this machine.

Idempotent (`enmasse.common.certificates`): what exists and still fits is kept, so services
that run on across an `up` keep trusting each other.
"""

from __future__ import annotations

from collections.abc import Mapping

from enmasse.cli.client import ADMIN_HOLDER
from enmasse.cli.local.var_dir import VarDir
from enmasse.common.certificates import (
    BROKER,
    CONTROL_PLANE,
    DATA_PLANE,
    STORE,
    Holder,
    ensure_authority,
    ensure_certificate,
)

CA = "ca"
ETCD_CA = "etcd-ca"
ETCD = "etcd"
CONFIG_ETCD = "config-etcd"
ROUTER = "router"
BROKER_HOLDER = "broker"

HOLDERS: Mapping[str, Holder] = {
    "config": Holder(name="config", role=CONTROL_PLANE),
    "storage-controller": Holder(name="storage-controller", role=CONTROL_PLANE),
    "router-agent": Holder(name="router-agent", role=CONTROL_PLANE),
    "subscription": Holder(name="subscription", role=CONTROL_PLANE),
    ADMIN_HOLDER: Holder(name=ADMIN_HOLDER, role=CONTROL_PLANE, server=False),
    ROUTER: Holder(name=ROUTER, role=DATA_PLANE),
    BROKER_HOLDER: Holder(name=BROKER_HOLDER, role=BROKER),
}
"""Directory name -> holder, for the CA every gRPC port trusts."""

ETCD_HOLDERS: Mapping[str, Holder] = {
    ETCD: Holder(name=ETCD, role=STORE),
    CONFIG_ETCD: Holder(name="config", role=CONTROL_PLANE, server=False),
}
"""Directory name -> holder, for etcd's own CA."""


def ensure_certificates(var: VarDir) -> None:
    """Both CAs and every holder's certificate under <var>/tls, kept where they still fit."""
    var.tls.mkdir(parents=True, exist_ok=True)
    var.tls.chmod(0o700)
    for ca, holders in ((CA, HOLDERS), (ETCD_CA, ETCD_HOLDERS)):
        authority = ensure_authority(var.tls_dir(ca), name=f"enmasse-{ca}")
        for directory, holder in holders.items():
            ensure_certificate(var.tls_dir(directory), holder, authority=authority)
