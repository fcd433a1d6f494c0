"""The certificates of a local installation: mutual TLS between every process `enmasse up` runs.

In: the var dir. Out: <var>/tls/ (mode 0700) holding two CAs and one directory per holder in
cert-manager's Secret layout (`tls.crt`, `tls.key` mode 0600, `ca.crt`), made before any program
starts (`ensure_certificates`):

- `ca/`: the CA every gRPC port trusts; it signs `config`, `storage-controller`, `router-agent`
  and `subscription` as `control-plane`, `router` (every router: its RouterAdmin port, the
  inter-router mesh and its links to brokers) as `data-plane`, `broker` (every broker:
  BrokerAdmin, the AMQP port a standard space's routers reach, and the drain a broker makes into
  another) as `broker`, and `operator`, the machine operator's client certificate (below);
- `ca.crt`: that CA's certificate alone, published for clients: the config service's certificate
  and every client endpoint's chain to it, so a tenant's CLI (`--ca-file`) and an amqps client
  verify against it. Nothing secret;
- `endpoints/<name>/`: one certificate per client endpoint (every router, a brokered space's
  broker), role `endpoint`, its program's name (`demo-router-0`), `localhost` and 127.0.0.1 in
  the SAN, server auth only: its amqps port presents it (`ensure_endpoint_certificate`, which the
  runtime calls before it starts the router or broker);
- `etcd-ca/`: etcd's own CA, which signs etcd's server certificate (`etcd`) and the one client
  certificate that opens it (`config-etcd`): no other process can reach the store.

Why the operator has a certificate of its own: the config service knows callers by their token
(the admin's is <var>/run/admin-token), so the CLI needs no certificate there; RouterAdmin,
BrokerAdmin and the router-agent know callers by certificate alone, and `enmasse status` and
`up`'s readiness wait ask them what they run. The `operator` role lets its holder read there,
never push a configuration or touch a queue: whoever reads <var>/tls/operator/tls.key (mode 0600,
the machine's operator) learns what the routers run, no more.

Why routers (and brokers) share one certificate for the mesh and gRPC: RouterAdmin tells its
callers apart by role alone, and a router or broker the runtime starts later needs no CA key to
get going; the certificate names the role, its holders are all the same kind of process on this
machine. A client endpoint's certificate is the one that names its process: a client checks the
name it dialled.

Idempotent (`enmasse.common.certificates`): what exists and still fits is kept, so services
that run on across an `up` keep trusting each other.
"""

from __future__ import annotations

from collections.abc import Mapping

from enmasse.cli.client import OPERATOR_HOLDER, trusted_ca_file
from enmasse.cli.local.var_dir import VarDir
from enmasse.common.certificates import (
    BROKER,
    CA_FILE,
    CONTROL_PLANE,
    DATA_PLANE,
    ENDPOINT,
    LOOPBACK_ADDRESSES,
    LOOPBACK_NAMES,
    OPERATOR,
    STORE,
    Holder,
    TlsFiles,
    ensure_authority,
    ensure_certificate,
)

CA = "ca"
ETCD_CA = "etcd-ca"
ETCD = "etcd"
CONFIG_ETCD = "config-etcd"
ROUTER = "router"
BROKER_HOLDER = "broker"
ENDPOINTS = "endpoints"

HOLDERS: Mapping[str, Holder] = {
    "config": Holder(name="config", role=CONTROL_PLANE),
    "storage-controller": Holder(name="storage-controller", role=CONTROL_PLANE),
    "router-agent": Holder(name="router-agent", role=CONTROL_PLANE),
    "subscription": Holder(name="subscription", role=CONTROL_PLANE),
    OPERATOR_HOLDER: Holder(name=OPERATOR_HOLDER, role=OPERATOR, server=False),
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
    """Both CAs, every holder's certificate under <var>/tls, and the published CA certificate,
    kept where they still fit."""
    var.tls.mkdir(parents=True, exist_ok=True)
    var.tls.chmod(0o700)
    for ca, holders in ((CA, HOLDERS), (ETCD_CA, ETCD_HOLDERS)):
        authority = ensure_authority(var.tls_dir(ca), name=f"enmasse-{ca}")
        for directory, holder in holders.items():
            ensure_certificate(var.tls_dir(directory), holder, authority=authority)
    _publish(var)


def _publish(var: VarDir) -> None:
    """<var>/tls/ca.crt: the clients' copy of the CA certificate, rewritten when it differs."""
    authority = (var.tls_dir(CA) / CA_FILE).read_bytes()
    published = trusted_ca_file(var.root)
    if not published.is_file() or published.read_bytes() != authority:
        partial = published.with_name(published.name + ".partial")
        partial.write_bytes(authority)
        partial.chmod(0o644)
        partial.replace(published)


def endpoint_tls(var: VarDir, name: str) -> TlsFiles:
    """Where the client endpoint `name` (a router's or broker's program name) keeps its amqps
    certificate: <var>/tls/endpoints/<name>/."""
    return TlsFiles(var.tls / ENDPOINTS / name)


def endpoint_holder(name: str) -> Holder:
    return Holder(
        name=name,
        role=ENDPOINT,
        dns_names=(name, *LOOPBACK_NAMES),
        ip_addresses=LOOPBACK_ADDRESSES,
        client=False,
    )


def ensure_endpoint_certificate(var: VarDir, name: str) -> TlsFiles:
    """The amqps certificate of the client endpoint `name`, issued by the CA `up` made (kept
    while it fits). The runtime calls it only in a var dir where `up` made the certificates."""
    authority = ensure_authority(var.tls_dir(CA), name=f"enmasse-{CA}")
    directory = endpoint_tls(var, name).directory
    directory.parent.mkdir(mode=0o700, exist_ok=True)
    return ensure_certificate(directory, endpoint_holder(name), authority=authority)
