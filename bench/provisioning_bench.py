"""Provisioning benchmark (issue 5): how long a user waits from declaring an address to using it.

What flows in: nothing but the options. The suite brings up the whole local runtime (`enmasse up`
in a temp var dir: supervisord, etcd, config, storage-controller, router-agent, subscription, and
the routers and brokers the rendered manifests ask for), and always takes it down again with the
runtime's own `down` (then SIGKILLs, by PID, anything it saw that outlived it).

What flows out: tables of figures, never assertions.

- per address type (queue, topic, subscription, anycast, multicast), N addresses created one
  after another through ConfigService.CreateAddress in one standard space; for each, the time
  from CreateAddress to the first message accepted through the space's router: queue and topic,
  a message sent to the router comes back ACCEPTED (the broker took it); subscription, a receiver
  attached to the subscription gets a message published to its topic; anycast and multicast, a
  receiver attached first gets the message and the producer sees ACCEPTED. p50 / p99 / max.
- the "new broker must start" case: K addresses of the dedicated plan `standard-large-queue`
  (broker credit 1), each of which makes the storage-controller render, and the runtime start,
  a broker of its own; the same measure; p50 / p99 / max.
- scale: many addresses (brokerless anycast and multicast, so that the figure is the control
  plane's and the router's, not the broker start-up's) Applied in batches into the same space;
  time from the first Apply to all Active, and the resident memory of the router(s),
  storage-controller, router-agent and config, read from /proc/<pid>/status of the PIDs supervisord
  reports.

Why a client connection per address: it is what a new user does (connect, attach, send), and an
attach refused while the address is not yet routed cannot spoil the next measurement. Every wait
is bounded: an address that does not work within its limit is counted as failed and the run goes on.

Run: `.venv/bin/python -m bench provisioning [--quick] [--record]`.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import grpc
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client, Receiver, Sender
from enmasse.amqp.engine import Outcome
from enmasse.cli.client import local_ca_file, resolve_token
from enmasse.common.credentials import verifying_credentials
from enmasse.resources.kinds import resource_of
from enmasse.resources.paging import every_item
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from bench.harness import Context, Table, suite
from tests.fixtures.local_runtime import enmasse, logs, stop_and_check, supervised

SPACE = "bench"
LARGE_SPACE = "bench-large"
SPACE_PLAN = "bench-standard"
LARGE_SPACE_PLAN = "bench-dedicated"
TOPIC_OF_SUBSCRIPTIONS = "sub-topic"
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 * 1024 * 1024)]
RPC_TIMEOUT = 30.0
SCALE_BATCH = 500

# (address type, plan): what each latency row measures, in the order they run.
# A subscription takes its credit on its topic's broker, and bin-packing fills that broker with
# queues too: so the subscriptions go first, under a copy of the standard subscription plan at
# half the credit, so that all N of them and their topic fit the one broker they must share.
SUBSCRIPTION_PLAN = "bench-small-subscription"
POOLED = (
    ("subscription", SUBSCRIPTION_PLAN),
    ("queue", "standard-small-queue"),
    ("topic", "standard-small-topic"),
    ("anycast", "standard-anycast"),
    ("multicast", "standard-multicast"),
)
PLANS = [plan for _kind, plan in POOLED]


@dataclass
class Latencies:
    kind: str
    plan: str
    seconds: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def percentile(values: list[float], fraction: float) -> float:
    """Nearest rank: of 100 samples, p99 is the 99th smallest, not the largest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def latency_row(table: Table, result: Latencies) -> None:
    ms = [s * 1000 for s in result.seconds]
    if not ms:
        table.add(result.kind, result.plan, 0, len(result.failed), "-", "-", "-")
        return
    table.add(
        result.kind,
        result.plan,
        len(ms),
        len(result.failed),
        round(statistics.median(ms), 1),
        round(percentile(ms, 0.99), 1),
        round(max(ms), 1),
    )


def rss_mib(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


# --- resources ---------------------------------------------------------------------------------


def address(
    *, space: str, name: str, kind: str, plan: str, topic: str = ""
) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata=resources_pb2.Metadata(name=name, space=space),
        spec=resources_pb2.AddressSpec(address=name, type=kind, plan=plan, topic=topic),
    )


def create_spaces(stub: config_pb2_grpc.ConfigServiceStub, *, large_brokers: int) -> None:
    """Two spaces: pooled types share brokers in one; dedicated queues get a quota of their own."""
    subscription = stub.GetAddressPlan(
        config_pb2.ObjectRef(name="standard-small-subscription"), timeout=RPC_TIMEOUT
    )
    subscription.spec.broker /= 2
    stub.CreateAddressPlan(
        resources_pb2.AddressPlan(metadata={"name": SUBSCRIPTION_PLAN}, spec=subscription.spec),
        timeout=RPC_TIMEOUT,
    )
    stub.CreateAddressSpacePlan(
        resources_pb2.AddressSpacePlan(
            metadata={"name": SPACE_PLAN},
            spec={
                "address_space_type": "standard",
                "address_plans": PLANS,
                # 300 pooled store-and-forward addresses at 0.01 fill three brokers and a bit.
                "quotas": {"max_addresses": 20_000, "max_brokers": 8, "max_routers": 1},
            },
        ),
        timeout=RPC_TIMEOUT,
    )
    stub.CreateAddressSpacePlan(
        resources_pb2.AddressSpacePlan(
            metadata={"name": LARGE_SPACE_PLAN},
            spec={
                "address_space_type": "standard",
                "address_plans": ["standard-large-queue"],
                "quotas": {"max_addresses": 100, "max_brokers": large_brokers, "max_routers": 1},
            },
        ),
        timeout=RPC_TIMEOUT,
    )
    for name, plan in ((SPACE, SPACE_PLAN), (LARGE_SPACE, LARGE_SPACE_PLAN)):
        stub.CreateAddressSpace(
            resources_pb2.AddressSpace(
                metadata={"name": name}, spec={"type": "standard", "plan": plan}
            ),
            timeout=RPC_TIMEOUT,
        )


def router_port(stub: config_pb2_grpc.ConfigServiceStub, space: str, *, limit: float) -> int:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = stub.GetAddressSpace(config_pb2.ObjectRef(name=space), timeout=RPC_TIMEOUT)
        for endpoint in found.status.endpoints:
            if endpoint.name == "amqp" and endpoint.port:
                return endpoint.port
        time.sleep(0.2)
    raise TimeoutError(f"space {space} published no amqp endpoint within {limit:.0f} s")


# --- the first message -------------------------------------------------------------------------


def attach(open_link: Callable[[], Sender | Receiver], *, deadline: float) -> Sender | Receiver:
    """Retries an attach the router refuses while it does not route the address yet (bounded)."""
    while True:
        try:
            return open_link()
        except (AmqpError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def accepted(sender: Sender, *, deadline: float) -> bool:
    """One message sent; True when its outcome is ACCEPTED before the deadline."""
    outcome = sender.send_async(codec.encode_message(b"first"))
    delivery = outcome.result(max(0.1, deadline - time.monotonic()))
    return delivery.outcome is Outcome.ACCEPTED


def first_message(port: int, *, kind: str, name: str, topic: str, limit: float) -> None:
    """Blocks until the first message on `name` is accepted through the router; raises if not."""
    deadline = time.monotonic() + limit
    with Client("127.0.0.1", port, timeout=limit) as client:
        if kind in ("queue", "topic"):
            while not accepted(
                attach(lambda: client.sender(name), deadline=deadline), deadline=deadline
            ):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name}: no ACCEPTED within {limit:.0f} s")
                time.sleep(0.02)
            return
        # A receiver first; the message goes to the address itself, or for a subscription to its
        # topic, and must come out of the receiver. The receiver accepts before the producer's
        # outcome is awaited: for anycast that outcome *is* the consumer's disposition.
        receiver = attach(lambda: client.receiver(name, credit=10), deadline=deadline)
        sender = attach(lambda: client.sender(topic or name), deadline=deadline)
        while time.monotonic() < deadline:
            outcome = sender.send_async(codec.encode_message(b"first"))
            try:
                receiver.accept(receiver.receive(0.5))
            except TimeoutError:
                continue  # multicast/topic before the route reached the receiver: send again
            delivery = outcome.result(max(0.1, deadline - time.monotonic()))
            if delivery.outcome is Outcome.ACCEPTED:
                return
        raise TimeoutError(f"{name}: nothing received within {limit:.0f} s")


def measure(
    stub: config_pb2_grpc.ConfigServiceStub,
    *,
    space: str,
    port: int,
    kind: str,
    plan: str,
    count: int,
    limit: float,
) -> Latencies:
    result = Latencies(kind=kind, plan=plan)
    topic = TOPIC_OF_SUBSCRIPTIONS if kind == "subscription" else ""
    for n in range(count):
        name = f"{kind}-{plan}-{n}"
        started = time.monotonic()
        stub.CreateAddress(
            address(space=space, name=name, kind=kind, plan=plan, topic=topic), timeout=RPC_TIMEOUT
        )
        try:
            first_message(port, kind=kind, name=name, topic=topic, limit=limit)
        except (AmqpError, TimeoutError) as err:
            result.failed.append(f"{name}: {err}")
            continue
        result.seconds.append(time.monotonic() - started)
    return result


# --- scale -------------------------------------------------------------------------------------


def count_active(stub: config_pb2_grpc.ConfigServiceStub, space: str) -> int:
    listed = every_item(
        partial(stub.ListAddresses, timeout=120), config_pb2.ListRequest(space=space)
    )
    return sum(1 for a in listed if a.status.status.phase == "Active")


def scale(
    stub: config_pb2_grpc.ConfigServiceStub, *, count: int, limit: float
) -> tuple[float, float, int]:
    """(Apply s, first Apply -> all Active s, Active count) for `count` more addresses."""
    before = count_active(stub, SPACE)
    started = time.monotonic()
    for first in range(0, count, SCALE_BATCH):
        batch = [
            resource_of(
                address(
                    space=SPACE,
                    name=f"scale-{n}",
                    kind="anycast" if n % 2 else "multicast",
                    plan="standard-anycast" if n % 2 else "standard-multicast",
                )
            )
            for n in range(first, min(count, first + SCALE_BATCH))
        ]
        stub.Apply(
            config_pb2.ApplyRequest(space=SPACE, manager="bench", resources=batch), timeout=120
        )
    applied = time.monotonic() - started
    deadline = started + limit
    active = count_active(stub, SPACE)
    while active < before + count and time.monotonic() < deadline:
        time.sleep(1.0)
        active = count_active(stub, SPACE)
    return applied, time.monotonic() - started, active - before


def resident(var: Path) -> dict[str, tuple[str, int, float]]:
    """Program -> (state, pid, RSS MiB) for every program supervisord runs."""
    return {
        name: (state, pid, round(rss_mib(pid), 1) if pid else 0.0)
        for name, (state, pid) in sorted(supervised(var).items())
    }


def memory_table(
    before: dict[str, tuple[str, int, float]], after: dict[str, tuple[str, int, float]]
) -> Table:
    table = Table(
        title="Provisioning: resident memory (VmRSS) before and after the scale run",
        columns=["program", "state", "pid", "RSS MiB before", "RSS MiB after"],
    )
    for name, (state, pid, rss) in after.items():
        table.add(name, state, pid, before.get(name, ("", 0, "-"))[2], rss)
    return table


# --- the suite ---------------------------------------------------------------------------------


@contextlib.contextmanager
def local_runtime(var: Path) -> Iterator[str]:
    """`enmasse up` in `var`; always `enmasse down` after (SIGKILL, by PID, what outlived it)."""
    seen: set[int] = set()
    try:
        up = enmasse(var, "up")
        if up.returncode != 0:
            raise RuntimeError(f"enmasse up failed: {up.stderr}\n{logs(var)}")
        seen.update(pid for _s, pid in supervised(var).values() if pid)
        yield (var / "run" / "config.addr").read_text().strip()
    finally:
        with contextlib.suppress(Exception):
            seen.update(pid for _s, pid in supervised(var).values() if pid)
        left = stop_and_check(var, seen)
        if left:
            raise RuntimeError(f"processes outlived `enmasse down` (SIGKILLed): {left}")


def warm_up(stub: config_pb2_grpc.ConfigServiceStub) -> tuple[float, int]:
    """The space's router and first pooled broker, and the topic the subscriptions read."""
    started = time.monotonic()
    stub.CreateAddress(
        address(
            space=SPACE, name=TOPIC_OF_SUBSCRIPTIONS, kind="topic", plan="standard-small-topic"
        ),
        timeout=RPC_TIMEOUT,
    )
    port = router_port(stub, SPACE, limit=120)
    first_message(port, kind="topic", name=TOPIC_OF_SUBSCRIPTIONS, topic="", limit=120)
    return time.monotonic() - started, port


LATENCY_COLUMNS = ["type", "plan", "n", "failed", "p50 ms", "p99 ms", "max ms"]


def admin_channel(var: Path, target: str) -> grpc.Channel:
    """The runtime's config service as the CLI reaches it: TLS verified against the CA
    certificate `enmasse up` published, and the admin token it wrote on every call."""
    ca_file = local_ca_file(var)
    if ca_file is None:
        raise RuntimeError(f"no CA certificate under {var}: was it made by `enmasse up`?")
    credentials = grpc.composite_channel_credentials(
        verifying_credentials(ca_file),
        grpc.access_token_call_credentials(resolve_token(option=None, var_dir=var)),
    )
    return grpc.secure_channel(target, credentials, options=CHANNEL_OPTIONS)


@suite("provisioning", "local runtime: CreateAddress -> first message per type, new brokers, scale")
def provisioning_suite(ctx: Context) -> Iterator[Table]:
    per_type = 20 if ctx.quick else 100
    dedicated = 3 if ctx.quick else 10
    at_scale = 1_000 if ctx.quick else 5_000
    with (
        tempfile.TemporaryDirectory(prefix="provisioning-bench-") as tmp,
        local_runtime(Path(tmp) / "var") as target,
        admin_channel(Path(tmp) / "var", target) as channel,
    ):
        var = Path(tmp) / "var"
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        create_spaces(stub, large_brokers=dedicated + 1)
        warm, port = warm_up(stub)

        pooled = Table(
            title=f"Provisioning: CreateAddress -> first message accepted, n={per_type} per type",
            columns=LATENCY_COLUMNS,
        )
        failures: list[str] = []
        for kind, plan in POOLED:
            result = measure(
                stub, space=SPACE, port=port, kind=kind, plan=plan, count=per_type, limit=30
            )
            latency_row(pooled, result)
            failures += result.failed
        pooled.notes.append(
            f"Warm-up before the rows (space router start + first pooled broker + topic "
            f"`{TOPIC_OF_SUBSCRIPTIONS}` usable): {warm:.1f} s."
        )
        yield pooled

        large = Table(
            title=f"Provisioning: new broker per address (standard-large-queue), n={dedicated}",
            columns=LATENCY_COLUMNS,
        )
        large_port = router_port(stub, LARGE_SPACE, limit=120)
        result = measure(
            stub,
            space=LARGE_SPACE,
            port=large_port,
            kind="queue",
            plan="standard-large-queue",
            count=dedicated,
            limit=60,
        )
        latency_row(large, result)
        failures += result.failed
        yield large

        memory_before = resident(var)
        applied, to_active, active = scale(stub, count=at_scale, limit=300)
        big = Table(
            title=f"Provisioning: {at_scale:,} more addresses in space `{SPACE}`",
            columns=["measure", "value"],
        )
        big.add(f"Apply in batches of {SCALE_BATCH} (s)", round(applied, 1))
        big.add("first Apply -> all Active (s)", round(to_active, 1))
        big.add("Active of the batch", active)
        yield big
        memory = memory_table(memory_before, resident(var))
        if failures:
            memory.notes.append("Failed addresses: " + "; ".join(failures[:10]))
        yield memory
