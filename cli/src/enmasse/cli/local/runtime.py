"""The runtime: rendered router and broker workloads -> supervisor programs, kept in step.

In: the GitOps output under <var>/gitops, where the router-agent renders each standard space's
routers and the storage-controller each space's brokers (one YAML file per workload, ports pinned
in annotations). Out: one `[program:x]` file per workload in <var>/supervisor.d/ (included by
supervisord.conf), and supervisord told about every change through its XML-RPC API:
`reloadConfig` says which groups were added, changed or removed; added ones get
`addProcessGroup`, removed ones `stopProcessGroup` + `removeProcessGroup`, changed ones both
(`supervisor.apply_config_changes`).

Why so: supervisord already restarts a crashed router or broker with back-off, logs it and stops
it with `down`; this module only follows the files. The loop runs as one more supervised program
(`enmasse runtime reconcile`, see programs.PROGRAMS), so it outlives `up` and comes back when
killed. It sleeps until a file under the GitOps output changes (inotify, through watchfiles) and
does one pass per burst of changes, plus one every REVIVE_EVERY seconds (which also revives
programs supervisord gave up on, and picks up a changed number of MQTT gateway instances): an
idle runtime reads nothing.

What a rendered file says and how its router or broker is started locally is the resource
model's (`enmasse.resources.rendered_routers`, `rendered_brokers`): the services that render the
files are only ever started here, as processes, never imported.

Transport: under `enmasse up` every router gets the routers' certificate and every broker the
brokers' (<var>/tls/router, <var>/tls/broker; local/tls.py) as $ENMASSE_TLS_DIR, so RouterAdmin
and BrokerAdmin speak mutual TLS, and so do the inter-router mesh and the links from routers to
a standard space's brokers (`--routers-only`); a var dir without them (tests of the pure parts)
adds nothing. Every router, and a brokered space's broker, is a client endpoint: it also gets its
own amqps certificate (<var>/tls/endpoints/<program>/, naming the program; `tls.py`), issued
before it starts, and its pinned amqps port.

Each standard space also gets its MQTT gateways (`enmasse-mqtt-gateway`, local/gateways.py; one,
or as many as `enmasse up --mqtt-gateways N` asked for) in front of its routers, each on a port
chosen once and kept, started after the routers.

`desired_programs` and `program_files` are pure (paths in, names and texts out) for the tests.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import xmlrpc.client
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from enmasse.cli.local.gateways import (
    ensure_pinned_port,
    gateway_command,
    gateway_dir,
    gateway_ids,
    pinned_port,
    retire_unwanted,
)
from enmasse.cli.local.programs import PROGRAMS, installed_program, program_section
from enmasse.cli.local.supervisor import apply_config_changes, supervisor_proxy
from enmasse.cli.local.tls import (
    BROKER_HOLDER,
    ROUTER,
    endpoint_tls,
    ensure_endpoint_certificate,
)
from enmasse.cli.local.var_dir import VarDir
from enmasse.common.certificates import TLS_DIR_ENV, TlsFiles
from enmasse.resources.rendered_brokers import GitOpsOutput, local_broker_command
from enmasse.resources.rendered_routers import (
    RenderedRouters,
    RouterWorkload,
    ensure_local_mesh_secret,
    local_router_command,
    local_router_dir,
)
from watchfiles import watch

log = structlog.get_logger("enmasse.runtime")

# Routers come up after the control plane and before brokers, in supervisord's order.
ROUTER_PRIORITY = 100
BROKER_PRIORITY = 200
GATEWAY_PRIORITY = 300  # after the routers it logs its clients in to
REVIVE_EVERY = 30.0


@dataclass(frozen=True)
class Program:
    """One router or broker as supervisord runs it."""

    name: str
    command: tuple[str, ...]
    workdir: Path  # made before the start: the process writes its ports file there
    priority: int
    environment: tuple[tuple[str, str], ...] = ()
    endpoint: bool = False  # a client endpoint: its amqps certificate is issued before it starts


def tls_environment(var: VarDir, holder: str) -> tuple[tuple[str, str], ...]:
    """$ENMASSE_TLS_DIR for a router or broker, when `up` made its certificate; else nothing."""
    files = TlsFiles(var.tls_dir(holder))
    return ((TLS_DIR_ENV, str(files.directory)),) if files.exist() else ()


def program_name(*, space: str, workload_id: str) -> str:
    """`demo-router-0`, `demo-broker-0`: the space first, once (broker ids already carry it)."""
    if workload_id.startswith(f"{space}-"):
        return workload_id
    return f"{space}-{workload_id}"


def desired_programs(var: VarDir) -> dict[str, Program]:
    """Every workload the GitOps output holds, by program name (`program_name`)."""
    programs: dict[str, Program] = {}
    router_tls, broker_tls = tls_environment(var, ROUTER), tls_environment(var, BROKER_HOLDER)
    # Client endpoints get an amqps certificate where `up` made certificates at all.
    amqps = bool(router_tls)
    routers = RenderedRouters(var.gitops)
    for space in routers.spaces():
        for router in routers.read_space(space).values():
            name = program_name(space=space, workload_id=router.router_id)
            command = local_router_command(
                router, var_dir=var.root, endpoint_tls=endpoint_tls(var, name) if amqps else None
            )
            programs[name] = Program(
                name=name,
                command=tuple(command),
                workdir=local_router_dir(router, var_dir=var.root),
                priority=ROUTER_PRIORITY,
                environment=router_tls,
                endpoint=amqps,
            )
        for gateway in _mqtt_gateways(var, space, routers.read_space(space)):
            programs[gateway.name] = gateway
    for space, brokers in GitOpsOutput(var.gitops).read_all().items():
        for broker in brokers.values():
            name = program_name(space=space, workload_id=broker.broker.id)
            serves_clients = amqps and not broker.routers_only
            command = local_broker_command(
                broker,
                var_dir=var.root,
                endpoint_tls=endpoint_tls(var, name) if serves_clients else None,
            )
            programs[name] = Program(
                name=name,
                command=tuple(command),
                workdir=var.root / "brokers" / space / broker.broker.id,
                priority=BROKER_PRIORITY,
                environment=broker_tls,
                endpoint=serves_clients,
            )
    return programs


def _mqtt_gateways(var: VarDir, space: str, routers: Mapping[str, RouterWorkload]) -> list[Program]:
    """The space's MQTT gateways whose ports are pinned, instance i in front of its i-th
    router (by id, round robin): every instance reaches the same addresses and sessions."""
    ordered = [routers[router_id] for router_id in sorted(routers)]
    programs = []
    for i, gateway_id in enumerate(gateway_ids(var) if ordered else []):
        port = pinned_port(var, space, gateway_id)
        if port is None:
            continue
        command = gateway_command(
            var,
            space=space,
            router=ordered[i % len(ordered)],
            port=port,
            executable=installed_program("enmasse-mqtt-gateway"),
            gateway_id=gateway_id,
        )
        programs.append(
            Program(
                name=f"{space}-{gateway_id}",
                command=tuple(command),
                workdir=gateway_dir(var, space, gateway_id),
                priority=GATEWAY_PRIORITY,
            )
        )
    return programs


def program_files(var: VarDir, programs: Mapping[str, Program]) -> dict[str, str]:
    """File name -> text of <var>/supervisor.d/ for these programs."""
    return {
        f"{p.name}.conf": program_section(
            name=p.name,
            command=p.command,
            var=var,
            priority=p.priority,
            environment=dict(p.environment),
        )
        for p in programs.values()
    }


def write_program_files(var: VarDir, files: Mapping[str, str]) -> bool:
    """Makes <var>/supervisor.d/ hold exactly `files`; True when anything changed."""
    var.programs_dir.mkdir(parents=True, exist_ok=True)
    changed = False
    for path in var.programs_dir.glob("*.conf"):
        if path.name not in files:
            path.unlink(missing_ok=True)
            changed = True
    for name, text in files.items():
        path = var.programs_dir / name
        with contextlib.suppress(OSError):
            if path.read_text() == text:
                continue
        partial = path.with_suffix(".partial")
        partial.write_text(text)
        partial.replace(path)
        changed = True
    return changed


def reconcile_once(var: VarDir, *, force: bool = False) -> dict[str, list[str]]:
    """One pass: files from the GitOps output, then supervisord, when anything changed."""
    for space in RenderedRouters(var.gitops).spaces():  # a standard space's MQTT ports, once
        for gateway_id in gateway_ids(var):
            ensure_pinned_port(var, space, gateway_id)
        retire_unwanted(var, space)
    programs = desired_programs(var)
    for program in programs.values():
        program.workdir.mkdir(parents=True, exist_ok=True)
        if program.endpoint:  # its amqps certificate, before it starts (kept while it fits)
            ensure_endpoint_certificate(var, program.name)
    for space in RenderedRouters(var.gitops).spaces():  # before any router of it starts
        ensure_local_mesh_secret(space=space, var_dir=var.root)
    if not write_program_files(var, program_files(var, programs)) and not force:
        return {}
    # The control plane's own programs are never touched here, whatever supervisord reports.
    proxy = supervisor_proxy(var)
    changes = apply_config_changes(proxy, ours=lambda name: name not in PROGRAMS)
    retire_removed_routers(var)
    return changes


def retire_removed_routers(var: VarDir) -> list[Path]:
    """Removes the ports file of each router no longer rendered (its space scaled down or
    deleted), once supervisord has stopped it (`apply_config_changes` waits for that), so the
    router-agent lists it no more among its space's endpoints. A crashed router is still
    rendered and keeps its file: supervisord starts it again on the same ports."""
    rendered = RenderedRouters(var.gitops)
    wanted = {
        (space, workload.router_id)
        for space in rendered.spaces()
        for workload in rendered.read_space(space).values()
    }
    retired = [
        ports
        for ports in (var.root / "routers").glob("*/*/ports.json")
        if (ports.parent.parent.name, ports.parent.name) not in wanted
    ]
    for ports in retired:
        ports.unlink(missing_ok=True)
    return retired


def revive_fatal(proxy: Any) -> list[str]:
    """Routers and brokers supervisord gave up on (FATAL after its back-off: a pinned port
    taken for a while, say) get one more start; the loop calls this every REVIVE_EVERY s."""
    revived = []
    for info in proxy.supervisor.getAllProcessInfo():
        if info["statename"] == "FATAL" and info["name"] not in PROGRAMS:
            with contextlib.suppress(xmlrpc.client.Fault):  # started meanwhile
                proxy.supervisor.startProcess(info["name"], False)
                revived.append(info["name"])
    return revived


def run(var: VarDir, *, interval: float = 0.5) -> None:
    """Reconciles once, then again each time a file under the GitOps output changes (and at
    least every REVIVE_EVERY seconds), until SIGTERM or SIGINT; a failed pass is retried after
    `interval` seconds."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log.info("reconciling", gitops=str(var.gitops), programs=str(var.programs_dir))
    var.gitops.mkdir(parents=True, exist_ok=True)
    changes = watch(
        var.gitops,
        stop_event=stop,
        debounce=100,  # a controller's pass writes several files: one reconcile for them all
        rust_timeout=int(REVIVE_EVERY * 1000),
        yield_on_timeout=True,
    )
    force = True  # a pass interrupted after writing files must still reach supervisord
    revive_at = time.monotonic() + REVIVE_EVERY
    while not stop.is_set():
        try:
            done = reconcile_once(var, force=force)
            force = False
            if time.monotonic() >= revive_at:
                revive_at = time.monotonic() + REVIVE_EVERY
                done["revived"] = revive_fatal(supervisor_proxy(var))
        except (OSError, xmlrpc.client.Error) as error:
            log.warning("reconcile failed; retrying", error=str(error))
            force = True
            stop.wait(interval)
            continue
        if any(done.values()):
            log.info("workloads changed", **done)
        next(changes, None)  # until the GitOps output changes, REVIVE_EVERY passes, or stop
    log.info("stopped")
