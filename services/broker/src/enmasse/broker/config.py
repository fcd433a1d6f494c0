"""Start-up settings of one broker process: flags, and an optional YAML file of queues and topics.

The YAML (`--config`) seeds addresses before the listener opens, for a broker run without a
control plane (local demos, benches):

    queues:
      orders: {max_delivery_attempts: 3, dead_letter_address: DLQ}
      DLQ: {}
    topics:
      news: {persistent: false}

Each value is the broker's slice of an address plan (see `Plan`); an unknown key or a bad value is
an error that names the address and the key, and the broker does not start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from enmasse.amqp.engine import Tls
from enmasse.amqp.tls import mutual_tls
from enmasse.broker.plan import Plan
from enmasse.common.certificates import TlsFiles
from enmasse.resources.contracts import MAX_MESSAGE_SIZE_BOUND


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 0
    admin_port: int = 0
    metrics_port: int | None = None  # Prometheus metrics; None: not served
    data_dir: Path | None = None
    # Bytes of one message; a larger delivery is rejected for its producer alone. As much as
    # any plan may allow: a standard space's routers enforce the space's own limit at the edge,
    # and this broker must never refuse what they passed (a brokered space's broker takes its
    # plan's smaller limit on each client link: `clients.py`).
    max_message_size: int = MAX_MESSAGE_SIZE_BOUND
    memory_limit_bytes: int = 512 << 20  # broker-wide: producers wait beyond it
    segment_bytes: int = 64 << 20
    credit_window: int = 1000
    idle_timeout: float = 0.0  # seconds; 0: no heartbeat, a silent peer is never dropped
    reap_interval: float = 0.25
    ports_file: Path | None = None
    tls: TlsFiles | None = None  # BrokerAdmin's mutual TLS (--tls-dir); None: plaintext
    routers_only: bool = False  # a standard space's broker: its AMQP port serves its routers
    # A brokered space's broker (--client-auth required): its AMQP port is its clients', who log
    # in as the space's users (`clients.py`); with client_tls (--tls-cert, --tls-key) an amqps
    # port too, on amqps_port.
    client_endpoint: bool = False
    client_tls: Tls | None = None
    amqps_port: int = 5671
    queues: dict[str, Plan] = field(default_factory=dict)
    topics: dict[str, Plan] = field(default_factory=dict)

    @property
    def router_tls(self) -> Tls | None:
        """The mutual TLS of a standard space's broker (--routers-only, with a certificate): its
        AMQP port takes only peers with a client certificate its CA signed (the routers, and a
        broker draining into it, which presents its own); None: plain AMQP (a brokered space's
        broker, whose clients log in on that port, or a broker without a certificate)."""
        if self.routers_only and self.tls is not None:
            return mutual_tls(self.tls)
        return None


def load_addresses(path: Path) -> tuple[dict[str, Plan], dict[str, Plan]]:
    """Reads queues and topics from the YAML file; raises ValueError naming what is wrong."""
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping with 'queues' and/or 'topics'")
    unknown = sorted(set(raw) - {"queues", "topics"})
    if unknown:
        raise ValueError(f"{path}: unknown section(s): {', '.join(unknown)}")
    return _plans(path, raw, "queues"), _plans(path, raw, "topics")


def _plans(path: Path, raw: dict[str, Any], section: str) -> dict[str, Plan]:
    plans = {}
    for name, settings in (raw.get(section) or {}).items():
        try:
            plans[str(name)] = Plan.from_dict(settings or {})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {section}.{name}: {exc}") from exc
    return plans
