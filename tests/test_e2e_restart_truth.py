"""Phases that tell the truth across restarts: `enmasse down`, `enmasse up --demo`, again and again.

A var dir of the test's own holds the demo space with 50 more addresses, ten of each of the five
types (`truth-<type>-NN`, named to sort after the demo's own, so the demo round still uses
`orders`, `prices`, ...). Then `down` and `up --demo`, `ITERATIONS` times, and every time:
- `up --demo` returns only once its demo round passed on all five types;
- an `AddressWatcher` follows the store (ConfigService.Watch, listed again whenever the config
  service comes back) and, the moment an address reads Active, attaches a receiver to it
  through the space's router (found as the router-agent finds it, by its ports file). Any
  refusal (`amqp:not-found`, or no router to attach to at all) while the store says Active is
  recorded, and the test demands there is none.

The watcher attaches with no credit and closes at once: it takes no message from the demo.
`test_restart_loop_short` runs 2 rounds in the normal suite; `test_restart_loop_soak` 10
(`-m soak`). Every loop is bounded in count and time; every process is stopped by PID at the end.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from enmasse.amqp import sasl
from enmasse.amqp.client import AmqpError, Client
from enmasse.cli.client import resolve_token
from enmasse.common.credentials import bearer_metadata
from enmasse.resources.contracts import ACTIVE, RETAINED_ADDRESS, SESSIONS_ADDRESS, WILL_ADDRESS
from enmasse.resources.discovery import LocalDirectory
from enmasse.v1 import config_pb2, config_pb2_grpc

from tests.fixtures.local_runtime import channel, enmasse, logs, stop_and_check, supervised
from tests.fixtures.waiting import wait_for

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SPACE = "demo"
PER_TYPE = 10
DEMO_ROUND = [
    "queue         orders         sent 1, received 1  ok",
    "topic         prices         sent 1, received 1  ok",
    "subscription  prices-audit   sent 1, received 1  ok",
    "anycast       rpc            sent 1, received 1  ok",
    "multicast     events         sent 1, received 1  ok",
]
UP_TIMEOUT = 300.0
ROUND_LIMIT = 360.0  # seconds one (down, up --demo) round may take before the test gives up

STORE_QUEUES = frozenset({RETAINED_ADDRESS, SESSIONS_ADDRESS, WILL_ADDRESS})


def truth_addresses() -> str:
    """Ten addresses of each type in the demo space; each subscription reads its own topic."""
    plans = {
        "queue": "standard-small-queue",
        "topic": "standard-small-topic",
        "subscription": "standard-small-subscription",
        "anycast": "standard-anycast",
        "multicast": "standard-multicast",
    }
    docs = []
    for kind, plan in plans.items():
        for i in range(PER_TYPE):
            name = f"truth-{kind}-{i:02d}"
            topic = f", topic: truth-topic-{i:02d}" if kind == "subscription" else ""
            docs.append(
                "---\napiVersion: enmasse.io/v1\nkind: Address\n"
                f"metadata: {{name: {name}, space: {SPACE}}}\n"
                f"spec: {{address: {name}, type: {kind}, plan: {plan}{topic}}}\n"
            )
    return "".join(docs)


@dataclass
class Refusal:
    address: str
    why: str
    at: float


@dataclass
class AddressWatcher:
    """Attaches to every address the moment the store says it is Active; records refusals."""

    var: Path
    checks: int = 0
    refusals: list[Refusal] = field(default_factory=list)
    streams: int = 0  # how many times the watch (re)started: once per `up`, and more
    _stop: threading.Event = field(default_factory=threading.Event)
    _stream: grpc.Future | None = None
    _thread: threading.Thread | None = None
    _client: Client | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="address-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.cancel()
        if self._thread is not None:
            self._thread.join(30)
        self._drop_client()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(grpc.RpcError, OSError, ValueError):
                self._follow(self._config_address())
            self._stop.wait(0.1)  # the config service is down (between `down` and `up`)

    def _config_address(self) -> str:
        return (self.var / "run" / "config.addr").read_text().strip()

    def _follow(self, target: str) -> None:
        """One watch stream: listed from scratch, so a phase left over in the store from before
        a restart is checked like a fresh one."""
        with channel(self.var, target) as opened:
            stream = config_pb2_grpc.ConfigServiceStub(opened).Watch(
                config_pb2.WatchRequest(kinds=["Address"], space=SPACE),
                metadata=bearer_metadata(resolve_token(option=None, var_dir=self.var)),
            )
            self._stream = stream
            self.streams += 1
            seen: dict[str, str] = {}
            for event in stream:
                if self._stop.is_set():
                    return
                if event.type not in (config_pb2.WatchEvent.ADDED, config_pb2.WatchEvent.MODIFIED):
                    continue
                address = event.object.address
                phase = address.status.status.phase
                before = seen.get(address.metadata.name)
                seen[address.metadata.name] = phase
                # The MQTT gateway's store queues are its identity's alone: the demo user may
                # not attach there, whatever the phase says (test_e2e_mqtt_stores covers them).
                if address.spec.address in STORE_QUEUES:
                    continue
                if phase == ACTIVE and before != ACTIVE:
                    self._check(address.spec.address)

    def _check(self, address: str) -> None:
        """Attach a receiver (no credit) through the space's router; record a refusal."""
        self.checks += 1
        for attempt in range(2):  # a connection to a router that restarted since: once more
            try:
                client = self._router_client()
                receiver = client.receiver(address, credit=0)
                receiver.close()
                return
            except AmqpError as error:
                if error.condition is None and attempt == 0:
                    self._drop_client()  # the connection itself went: reconnect and retry
                    continue
                self._refused(address, str(error))
                return
            except (OSError, TimeoutError, RuntimeError) as error:
                self._drop_client()
                if attempt == 1:
                    self._refused(address, f"no router to attach to: {error!r}")
                    return

    def _refused(self, address: str, why: str) -> None:
        self.refusals.append(Refusal(address=address, why=why, at=time.time()))
        self._drop_client()

    def _router_client(self) -> Client:
        if self._client is not None and self._client.closed_with.done():
            self._drop_client()  # its router went away (a `down`): a connection to the new one
        if self._client is None:
            found = LocalDirectory(self.var)
            found.refresh()
            routers = found.routers(SPACE)
            if not routers:
                raise RuntimeError(f"no router of space {SPACE} has a ports file")
            self._client = Client(
                routers[0].host,
                routers[0].amqp_port,
                timeout=5,
                user="app",  # the demo user of examples/: its plan lets no one in without one
                password="demo-password",
                mechanisms=sasl.CLIENT_MECHANISMS,
            )
        return self._client

    def _drop_client(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None


@pytest.fixture
def demo_examples(tmp_path: Path) -> Path:
    """examples/ plus the 50 `truth-*` addresses, in a folder of the test's own."""
    folder = tmp_path / "examples"
    folder.mkdir()
    for manifest in EXAMPLES.glob("*.yaml"):
        shutil.copy(manifest, folder / manifest.name)
    (folder / "truth-addresses.yaml").write_text(truth_addresses())
    return folder


@pytest.fixture
def restarts(tmp_path: Path, demo_examples: Path) -> Iterator[RestartLoop]:
    loop = RestartLoop(var=tmp_path / "var", examples=demo_examples)
    try:
        yield loop
    finally:
        loop.watcher.stop()
        with contextlib.suppress(Exception):
            loop.seen.update(pid for _s, pid in supervised(loop.var).values() if pid)
        alive = stop_and_check(loop.var, loop.seen)
        assert alive == [], f"processes left alive after down: {alive}"


@dataclass
class RestartLoop:
    var: Path
    examples: Path
    seen: set[int] = field(default_factory=set)
    watcher: AddressWatcher = field(init=False)

    def __post_init__(self) -> None:
        self.watcher = AddressWatcher(var=self.var)

    def up_demo(self) -> float:
        started = time.monotonic()
        up = enmasse(self.var, "up", "--demo", "--examples", str(self.examples), timeout=UP_TIMEOUT)
        took = time.monotonic() - started
        self.seen.update(pid for _s, pid in supervised(self.var).values() if pid)
        assert up.returncode == 0, up.stdout + up.stderr + logs(self.var)
        assert up.stdout.splitlines()[-5:] == DEMO_ROUND, up.stdout
        return took

    def down(self) -> float:
        started = time.monotonic()
        down = enmasse(self.var, "down", timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        return time.monotonic() - started

    def run(self, rounds: int) -> None:
        self.up_demo()  # the first: applies the examples and the 50 more
        self.watcher.start()
        for number in range(1, rounds + 1):
            started = time.monotonic()
            checks = self.watcher.checks
            down_s = self.down()
            up_s = self.up_demo()
            checked = self.watcher.checks - checks
            print(
                f"\nround {number}/{rounds}: down {down_s:.1f} s, up --demo {up_s:.1f} s, "
                f"{checked} addresses checked the moment they turned Active, "
                f"{len(self.watcher.refusals)} refused so far"
            )
            assert self.watcher.refusals == [], self.watcher.refusals
            assert time.monotonic() - started < ROUND_LIMIT
        # Every address turned Active after every restart (or was listed Active by a watch
        # started anew), and was attached to then: the watcher may trail `up` by a little.
        expected = (rounds + 1) * (5 + 5 * PER_TYPE)
        wait_for(lambda: self.watcher.checks >= expected, what=f"{expected} checks", limit=60)
        assert self.watcher.refusals == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_restart_loop_short(restarts: RestartLoop) -> None:
    restarts.run(rounds=2)


@pytest.mark.soak
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_restart_loop_soak(restarts: RestartLoop) -> None:
    restarts.run(rounds=10)
