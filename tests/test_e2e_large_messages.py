"""End to end on the local runtime: large messages through a standard space's router, and the
plan's message size limit refused for one producer alone.

Two spaces on one `enmasse up` (`local_runtime`): `bulk`, of the default plan standard-small (no
`maxMessageSize` needed: 100 MiB), and `snug`, of a plan `snug` whose `maxMessageSize` is 64 KiB.
Real clients log in with SCRAM on each space's router endpoint, as a user would. What is
asserted is what clients see: the bytes back (sha256), outcomes, the exact condition and its
description (which names the plan's limit, so the refusal was the router's: a standard space's
broker allows 512 MiB), every neighbour's message arriving and none RELEASED; and the broker
process's peak RSS (VmHWM, printed) while a 100 MiB message passes through it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import pytest
from enmasse.amqp import codec, sasl
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Condition, Delivery, Outcome

from tests.fixtures.local_runtime import LocalRuntime

pytestmark = pytest.mark.slow

Connect = Callable[[str], Client]

SNUG_LIMIT = 64 * 1024
MIB = 1 << 20

SPACES = f"""
apiVersion: enmasse.io/v1
kind: AddressSpacePlan
metadata: {{name: snug}}
spec:
  addressSpaceType: standard
  addressPlans: [standard-small-queue]
  quotas: {{maxAddresses: 10, maxBrokers: 1, maxRouters: 1, maxMessageSize: {SNUG_LIMIT}}}
---
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {{name: bulk}}
spec: {{type: standard, plan: standard-small}}
---
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {{name: snug}}
spec: {{type: standard, plan: snug}}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {{name: big, space: bulk}}
spec: {{address: big, type: queue, plan: standard-small-queue}}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {{name: shared, space: snug}}
spec: {{address: shared, type: queue, plan: standard-small-queue}}
""" + "".join(
    f"""---
apiVersion: enmasse.io/v1
kind: MessagingUser
metadata: {{name: mover, space: {space}}}
spec:
  username: mover
  password: mover-password
  authorization: [{{addresses: ["#"], operations: [send, recv]}}]
"""
    for space in ("bulk", "snug")
)


@pytest.fixture(scope="module")
def spaces(local_runtime: LocalRuntime) -> LocalRuntime:
    local_runtime.apply(SPACES, name="large-messages.yaml")
    local_runtime.wait_active("bulk", ["big"], timeout=240)
    local_runtime.wait_active("snug", ["shared"], timeout=240)
    return local_runtime


@pytest.fixture
def connect(spaces: LocalRuntime) -> Iterator[Connect]:
    """A factory of clients on a space's router, every one closed at the end."""
    opened: list[Client] = []

    def make(space: str) -> Client:
        client = Client(
            "127.0.0.1",
            spaces.router_port(space),
            timeout=30,
            user="mover",
            password="mover-password",
            mechanisms=sasl.CLIENT_MECHANISMS,
        )
        opened.append(client)
        return client

    yield make
    for client in opened:
        with contextlib.suppress(Exception):
            client.close()


def broker_pids(runtime: LocalRuntime, space: str) -> list[int]:
    return [
        pid
        for name, (_state, pid) in runtime.processes().items()
        if name.startswith(f"{space}-") and "broker" in name and pid
    ]


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def round_trip(connect: Connect, size: int, *, timeout: float) -> tuple[int, float]:
    """A message of `size` encoded bytes to queue `big` and back; (its size, seconds taken)."""
    body = os.urandom(size - 64)  # the header sections and the body's own framing: < 64 bytes
    payload = codec.encode_message(body, durable=True)
    assert len(payload) <= size
    receiver = connect("bulk").receiver("big", credit=1)
    started = time.monotonic()
    sent = connect("bulk").sender("big").send(payload, timeout=timeout)
    assert sent.outcome is Outcome.ACCEPTED, sent.error
    delivery = receiver.receive(timeout)
    receiver.accept(delivery)
    took = time.monotonic() - started
    got = codec.read_body(delivery.payload)
    assert isinstance(got, bytes)
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(body).hexdigest()
    return len(payload), took


def test_a_1_mib_message_goes_through_the_router_to_a_queue_and_back(connect: Connect) -> None:
    size, _took = round_trip(connect, MIB + 4096, timeout=60)
    assert size > MIB, "more than the broker's old 1 MiB default, headers included"


def test_a_100_mib_message_goes_through_and_the_broker_holds_it_about_once(
    spaces: LocalRuntime, connect: Connect
) -> None:
    pids = broker_pids(spaces, "bulk")
    assert len(pids) == 1, pids
    baseline = peak_rss(pids[0])
    size, took = round_trip(connect, 100 * MIB, timeout=240)
    peak = peak_rss(pids[0])
    print(
        f"\n100 MiB message: {size} bytes in {took:.1f} s ({size / took / 1e6:.1f} MB/s "
        f"producer to consumer); broker VmHWM {baseline / MIB:.0f} MiB before, "
        f"{peak / MIB:.0f} MiB after ({(peak - baseline) / size:.2f}x the message)"
    )
    # The budget: the message once in its queue, the journal's write buffer until the batch is
    # on disk, and proton's two send buffers (the delivery's and the transport's, ~1.25x each)
    # while it goes to the router: ~4x at the worst moment. Proton's receive buffer no longer
    # holds another copy (chunks are read out as they come: `enmasse.amqp.engine.large`).
    assert peak < baseline + 4.5 * size, f"broker peak RSS {peak} bytes (baseline {baseline})"


def test_an_oversized_message_is_rejected_for_its_producer_alone(connect: Connect) -> None:
    receiver = connect("snug").receiver("shared", credit=500)
    neighbour = connect("snug").sender("shared")
    count = 300
    neighbours: list[Future[Delivery]] = []
    offender = connect("snug").sender("shared")
    assert offender.link is not None
    assert offender.link.remote_max_message_size == SNUG_LIMIT, "the router advertises it"
    oversized = codec.encode_message(b"x" * (4 * SNUG_LIMIT))
    sends = (neighbour.send_async(codec.encode_message(f"n{i}")) for i in range(count))
    neighbours += [next(sends) for _ in range(count // 3)]
    refused = offender.send_async(oversized)  # while the neighbour's messages are in flight
    neighbours += list(sends)

    rejected = refused.result(60)
    assert rejected.outcome is Outcome.REJECTED
    assert rejected.error == Condition(
        "amqp:link:message-size-exceeded",
        f"message of {len(oversized)} bytes exceeds the limit of {SNUG_LIMIT} bytes",
    )
    outcomes = [f.result(60).outcome for f in neighbours]
    assert outcomes == [Outcome.ACCEPTED] * count, "no neighbour's message RELEASED"
    fits = offender.send(codec.encode_message("fits"), timeout=30)
    assert fits.outcome is Outcome.ACCEPTED, "the producer's own link goes on"
    assert not offender.detached.done()

    bodies = set()
    for _ in range(count + 1):
        delivery = receiver.receive(30)
        receiver.accept(delivery)
        bodies.add(str(codec.read_body(delivery.payload)))
    assert bodies == {f"n{i}" for i in range(count)} | {"fits"}
