"""Prometheus metrics of every EnMasse-py process: one HTTP port, and the names dashboards read.

What flows in: each process's own figures. A router and a broker hand over a collector that
reads their counters when Prometheus scrapes (the same counters RouterAdmin's GetStats and
BrokerAdmin's ListAddresses read), so nothing on the message path is touched for metrics; a
control-plane loop times its passes with `LoopMetrics`. What flows out: the text exposition
format on `http://<host>:<port>/metrics` (prometheus-client's own server, on a thread of its own).

Why the names live here: they cross every boundary there is. Routers and brokers write them, the
PodMonitors in k8s/monitoring scrape the port named `metrics` (`METRICS_PORT` in every pod's
manifest), and the Grafana dashboard there queries them by name. Per address, the labels are
`address` and `type` (the address type, as the router or broker knows it); per router `router`;
per loop `loop`. The address space is not a label a process sets: every router and broker pod
carries `enmasse.io/space`, and the PodMonitors copy it onto what they scrape (`podTargetLabels`),
so the label means the same for every kind of pod and no process has to be told its space.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import start_http_server as _start_http_server

METRICS_PORT = 9102
"""The port named `metrics` in every pod of the platform (the PodMonitors scrape it)."""

# Per address (routers and brokers). Counters carry `_total` in the exposition.
ADDRESS_MESSAGES_IN = "enmasse_address_messages_in"
ADDRESS_MESSAGES_OUT = "enmasse_address_messages_out"
ADDRESS_OUTCOMES = "enmasse_address_outcomes"  # label `outcome`: accepted, rejected, ...
ADDRESS_STORED = "enmasse_address_messages_stored"
ADDRESS_STORED_BYTES = "enmasse_address_stored_bytes"
ADDRESS_DEAD_LETTERED = "enmasse_address_messages_dead_lettered"
ADDRESS_EXPIRED = "enmasse_address_messages_expired"
ADDRESS_CONSUMERS = "enmasse_address_consumers"
ADDRESS_PRODUCERS = "enmasse_address_producers"
ADDRESS_LABELS = ("address", "type")

# Per router.
ROUTER_CONNECTIONS = "enmasse_router_connections"  # label `role`: normal, inter-router, broker
ROUTER_LINKS = "enmasse_router_links"
ROUTER_DELIVERIES = "enmasse_router_deliveries"  # label `outcome`, summed over its addresses
ROUTER_REACHABLE_ROUTERS = "enmasse_router_reachable_routers"

# Per broker.
BROKER_MEMORY_USED = "enmasse_broker_memory_used_bytes"
BROKER_MEMORY_LIMIT = "enmasse_broker_memory_limit_bytes"

# Per control-plane loop.
LOOP_PASS_SECONDS = "enmasse_loop_pass_seconds"
LOOP_ERRORS = "enmasse_loop_errors"
LOOP_QUEUE_DEPTH = "enmasse_loop_queue_depth"


def serve_metrics(*, host: str, port: int, registry: CollectorRegistry = REGISTRY) -> int:
    """Serves `registry` on host:port (0: a free port) from a daemon thread; the bound port."""
    server, _thread = _start_http_server(port, addr=host, registry=registry)
    return int(server.server_port)


def add_metrics_port_flag(parser: argparse.ArgumentParser) -> None:
    """`--metrics-port N` for a service's command line (none: no metrics served)."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help=f"Prometheus metrics on this port (0: a free one; {METRICS_PORT} in a cluster), "
        "on the --listen host; none: not served",
    )


def serve_service_metrics(*, listen: str, port: int | None) -> int | None:
    """Serves the default registry on `--listen`'s host and `port` when one is given."""
    if port is None:
        return None
    host = listen.rsplit(":", 1)[0].strip("[]") or "0.0.0.0"
    return serve_metrics(host=host, port=port)


class LoopMetrics:
    """A control-plane loop's figures: how long each pass took, how many failed, how much work
    waits. One per loop name; the families are made once per registry (the default one in a
    service, a fresh one in a test)."""

    def __init__(self, loop: str, *, registry: CollectorRegistry = REGISTRY) -> None:
        passes, errors, waiting = _loop_families(registry)
        self._pass = passes.labels(loop)
        self._error = errors.labels(loop)
        self._depth = waiting.labels(loop)

    @contextmanager
    def timed_pass(self) -> Iterator[None]:
        """Times the pass in the `with`; one that raises counts as an error (and re-raises)."""
        started = time.perf_counter()
        try:
            yield
        except Exception:
            self._error.inc()
            raise
        finally:
            self._pass.observe(time.perf_counter() - started)

    def waiting(self, count: int) -> None:
        self._depth.set(count)


_LOOP_FAMILIES: dict[int, tuple[Histogram, Counter, Gauge]] = {}


def _loop_families(registry: CollectorRegistry) -> tuple[Histogram, Counter, Gauge]:
    try:
        return _LOOP_FAMILIES[id(registry)]
    except KeyError:
        pass
    families = (
        Histogram(
            LOOP_PASS_SECONDS,
            "Time one pass of a control-plane loop took (reconcile, push, sync).",
            ("loop",),
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=registry,
        ),
        Counter(
            LOOP_ERRORS, "Passes of a control-plane loop that failed.", ("loop",), registry=registry
        ),
        Gauge(
            LOOP_QUEUE_DEPTH,
            "Work a control-plane loop has not done yet.",
            ("loop",),
            registry=registry,
        ),
    )
    _LOOP_FAMILIES[id(registry)] = families
    return families
