"""The router-agent's loop: follow the store, push to routers, report phases.

What flows in: Address, AddressSpace and MessagingUser changes through the informer (spec, the
storage-controller's placement, users' password hashes), the space's routers and brokers from the
`Directory` (`enmasse.resources.discovery`), and the routers' answers.
What flows out: a RouterConfig pushed to every router of every space (same generation, peers =
the others), Address status phase (Active / Configuring with why) and AddressSpace status
(phase, the amqp and amqps endpoints of its routers) written through the config service, and,
given a GitOps output directory, each standard space's router workloads rendered there
(`workloads`: as many routers as its plan says), and, given a write-back repository, those
renders committed and pushed with a message saying why (`enmasse.resources.gitops_writeback`).

How it is built: one reconcile pass per wake-up (a store change, a router's connection lost or
back, or a tick that rereads the directory and probes the routers). A pass is a pure
computation (`routing`) followed by three idempotent effects: push where a router is behind,
probe where it is not (to notice restarts), and write a status only where it differs from what
the store holds, with compare-and-swap on the resource_version it read, so a concurrent write
by the storage-controller (placement) is never overwritten: the write is refused (ABORTED), the
informer brings the new version, and the next pass writes again on top of it. Address
statuses go many to a call (`enmasse.resources.status_batches`); an entry stale or gone refuses
its batch, which goes again without it, so only that one waits for the next pass.

What the agent writes into a stored address's status, and what it leaves to the
storage-controller, is decided by `routing.status_to_write`.

Every call has a deadline; a router that does not answer delays only its own addresses' phases.
A phase says what the routers run now: a router the agent loses (its connection drops, as it
does at once when the process dies, or it stops answering) takes its space's addresses back to
Configuring in the next pass, naming it, until it has its configuration again (`push`).
Only standard spaces are the agent's: a brokered space has no routers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc
import structlog
from enmasse.common.certificates import TlsFiles
from enmasse.common.credentials import TokenSource, config_channel
from enmasse.common.metrics import LoopMetrics
from enmasse.resources.client_access import endpoint_users
from enmasse.resources.discovery import Directory, client_endpoints
from enmasse.resources.gitops_writeback import WorkloadRepository
from enmasse.resources.informer import Informer
from enmasse.resources.kinds import object_of
from enmasse.resources.mqtt_stores import space_users
from enmasse.resources.status_batches import (
    STATUS_BATCH_DEADLINE,
    OwnWrites,
    StatusWrite,
    status_batches,
    status_request,
    write_batch,
)
from enmasse.router_agent.elasticity import DOWN_AFTER, UP_AFTER, Elasticity, elastic, load_of
from enmasse.router_agent.push import RouterSession
from enmasse.router_agent.routing import (
    LoginPolicy,
    Readiness,
    SpaceRouting,
    address_routes,
    placements_of,
    readiness,
    space_readiness,
    status_to_write,
    trace_sampling_of,
)
from enmasse.router_agent.workloads import RouterWorkloads, elastic_count, router_count
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2, router_pb2

log = structlog.get_logger(__name__)

STATUS_DEADLINE = 10.0
STATUS_WRITES_IN_FLIGHT = 32
LOAD_EVERY = 5.0  # seconds between two load samples of a space its plan scales by load
COUNTERS = (
    "deliveries_in",
    "deliveries_out",
    "accepted",
    "rejected",
    "released",
    "modified",
    "dropped",
    "consumers",
    "producers",
)


class RouterAgent:
    def __init__(
        self,
        *,
        config_target: str | Callable[[], str],
        directory: Directory,
        token: TokenSource | None = None,
        tls: TlsFiles | None = None,
        tick: float = 0.5,
        probe_every: float = 1.0,
        workloads: RouterWorkloads | None = None,
        routers_per_space: int | None = None,
        writeback: WorkloadRepository | None = None,
        mqtt_store: router_pb2.RouterUser | None = None,
        scale_up_after: float = UP_AFTER,
        scale_down_after: float = DOWN_AFTER,
        load_every: float = LOAD_EVERY,
    ) -> None:
        self._config_target = config_target
        self.mqtt_store = mqtt_store  # the MQTT gateway's store identity, for spaces serving MQTT
        self._token = token
        self._tls = tls  # this agent's certificate: to config and to every RouterAdmin
        self.directory = directory
        self.workloads = workloads
        self.routers_per_space = routers_per_space  # None: each space's plan says
        self.writeback = writeback
        # Spaces whose plan scales routers by load: their counts, moved by load samples taken
        # every `load_every` s (elasticity.py); the render follows them.
        self.elastic: dict[str, Elasticity] = {}
        self._scale_after = (scale_up_after, scale_down_after)
        self.load_every = load_every
        self._sampled: dict[str, float] = {}
        self.tick = tick
        self.probe_every = probe_every
        self.informer = Informer(
            target=config_target,
            kinds=["Address", "AddressSpace", "MessagingUser", "AddressSpacePlan"],
            token=token,
            tls=tls,
            with_secrets=True,  # the users' password hashes, for the routers to check logins
            on_added=self._changed,
            on_modified=self._changed,
            on_deleted=self._changed,
        )
        self.spaces: dict[str, SpaceRouting] = {}
        self.sessions: dict[str, dict[str, RouterSession]] = {}
        self.passes = 0
        self.metrics = LoopMetrics("router-agent")  # each pass timed, failures counted
        self.status_writes = 0
        self._wake = asyncio.Event()
        self._last_probe = 0.0
        self._task: asyncio.Task[None] | None = None
        self._status_slots = asyncio.Semaphore(STATUS_WRITES_IN_FLIGHT)
        self._channel: grpc.aio.Channel | None = None
        self._channel_target = ""
        self._status_tasks: dict[str, asyncio.Task[None]] = {}
        self._failing: dict[str, str] = {}
        self._own_writes = OwnWrites()  # statuses written that the informer has not shown yet

    # ------------------------------------------------------------ running

    def _changed(self, _resource: resources_pb2.Resource) -> None:
        self._wake.set()

    def wake(self) -> None:
        """A pass now (a router or broker started, moved or went away)."""
        self._wake.set()

    def start(self) -> None:
        self.informer.start()
        self._task = asyncio.get_running_loop().create_task(self.run(), name="router-agent")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in self._status_tasks.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._status_tasks.clear()
        await self.informer.stop()
        for sessions in self.sessions.values():
            for session in sessions.values():
                await session.close()
        self.sessions.clear()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def run(self) -> None:
        await self.informer.synced.wait()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tick):
                    await self._wake.wait()
            self._wake.clear()
            try:
                with self.metrics.timed_pass():
                    await self.reconcile()
            except Exception:
                # One bad pass (a bug, a store hiccup) must not end the agent: next tick retries.
                log.exception("reconcile pass failed")

    # ------------------------------------------------------------ one pass

    async def reconcile(self) -> None:
        self.passes += 1
        self.directory.refresh()
        target = self._config_target() if callable(self._config_target) else self._config_target
        probe = time.monotonic() - self._last_probe >= self.probe_every
        if probe:
            self._last_probe = time.monotonic()
        # Brokered spaces have no routers: clients talk to their one broker directly, and the
        # storage-controller reports their addresses' phases.
        spaces = [
            space
            for space in (object_of(r) for r in self.informer.list("AddressSpace"))
            if space.spec.type != "brokered"
        ]
        live = {s.metadata.name for s in spaces}
        for gone in [name for name in self.spaces if name not in live]:
            await self._forget(gone)
        if self.workloads is not None:
            await self._render(self.workloads, spaces)
        stub = await self._config_stub(target)
        await asyncio.gather(*(self._space_pass(stub, space, probe=probe) for space in spaces))

    async def _render(
        self, workloads: RouterWorkloads, spaces: list[resources_pb2.AddressSpace]
    ) -> None:
        plans = {
            space.metadata.name: (space.spec.plan, self._plan(space.spec.plan)) for space in spaces
        }
        reasons = await asyncio.to_thread(
            _render_workloads,
            workloads,
            plans,
            override=self.routers_per_space,
            elastic={name: (e.routers, e.reason) for name, e in self.elastic.items()},
        )
        if self.writeback is not None:
            self.writeback.note(reasons)

    def _plan(self, name: str) -> resources_pb2.AddressSpacePlan | None:
        found = self.informer.get("AddressSpacePlan", name)
        return found.address_space_plan if found is not None else None

    async def _config_stub(self, target: str) -> config_pb2_grpc.ConfigServiceStub:
        """One channel to the config service, kept across passes (a new one if it moved)."""
        if self._channel is None or self._channel_target != target:
            if self._channel is not None:
                await self._channel.close()
            self._channel = config_channel(target, token=self._token, tls=self._tls)
            self._channel_target = target
        return config_pb2_grpc.ConfigServiceStub(self._channel)

    async def _space_pass(
        self,
        stub: config_pb2_grpc.ConfigServiceStub,
        space: resources_pb2.AddressSpace,
        *,
        probe: bool,
    ) -> None:
        name = space.metadata.name
        addresses = [object_of(r) for r in self.informer.list("Address", space=name)]
        routers = self.directory.routers(name)
        routing = self.spaces.setdefault(name, SpaceRouting(space=name))
        routes, held_back = address_routes(
            addresses=addresses,
            placements=placements_of(addresses),
            brokers=self.directory.brokers(name),
        )
        sessions = await self._sessions(name, routers)
        ahead = max((s.ahead for s in sessions.values()), default=0)
        plan = self.informer.get("AddressSpacePlan", space.spec.plan)  # its quotas: the limits
        users = space_users(
            endpoint_users(object_of(r) for r in self.informer.list("MessagingUser", space=name)),
            space_plan=plan.address_space_plan if plan is not None else None,
            identity=self.mqtt_store,
        )
        routing.update(
            routes=routes,
            held_back=held_back,
            routers=routers,
            floor=ahead,
            users=users,
            quotas=plan.address_space_plan.spec.quotas if plan is not None else None,
            logins=LoginPolicy.of(plan.address_space_plan if plan is not None else None),
            trace_sampling=trace_sampling_of(plan.address_space_plan if plan is not None else None),
        )
        await self._converge(routing, sessions, probe=probe)
        if plan is not None:
            await self._sample_load(name, sessions, plan.address_space_plan.spec.quotas)
        applied = {router_id: s.applied for router_id, s in sessions.items()}
        unreachable = {router_id for router_id, s in sessions.items() if not s.reachable}
        phases = readiness(
            addresses=addresses,
            held_back=routing.held_back,
            since=routing.since,
            applied=applied,
            routers=routing.routers,
            unreachable=unreachable,
        )
        # Status writes run beside the passes, one batch per space at a time: thousands of them
        # take the config service seconds, and pushes to routers must not wait behind them.
        writing = self._status_tasks.get(name)
        if writing is None or writing.done():
            self._status_tasks[name] = asyncio.get_running_loop().create_task(
                self._write_statuses(stub, space, addresses, phases, routing, applied, unreachable),
                name=f"status-{name}",
            )

    async def _write_statuses(
        self,
        stub: config_pb2_grpc.ConfigServiceStub,
        space: resources_pb2.AddressSpace,
        addresses: list[resources_pb2.Address],
        phases: dict[str, Readiness],
        routing: SpaceRouting,
        applied: dict[str, int],
        unreachable: set[str],
    ) -> None:
        written = 0
        started = time.monotonic()
        try:
            # The space first: when an address reads Active, the endpoints to reach it are out.
            written += await self._write_space_status(stub, space, routing, applied, unreachable)
            written += await self._write_address_statuses(stub, addresses, phases)
        except Exception:
            log.exception("status writes failed", space=space.metadata.name)
        if written:
            log.info(
                "statuses written",
                space=space.metadata.name,
                count=written,
                seconds=round(time.monotonic() - started, 3),
                generation=routing.generation,
            )

    async def _sessions(self, space: str, routers: Iterable[Any]) -> dict[str, RouterSession]:
        sessions = self.sessions.setdefault(space, {})
        wanted = {r.router_id: r for r in routers}
        for router_id, session in list(sessions.items()):
            if wanted.get(router_id) != session.endpoint:
                await session.close()
                del sessions[router_id]
        for router_id, endpoint in wanted.items():
            if router_id not in sessions:
                session = RouterSession(
                    space=space, endpoint=endpoint, on_change=self._wake.set, tls=self._tls
                )
                session.watch()
                sessions[router_id] = session
        return sessions

    async def _converge(
        self, routing: SpaceRouting, sessions: dict[str, RouterSession], *, probe: bool
    ) -> None:
        work: list[Awaitable[Any]] = []
        for router_id, session in sessions.items():
            if session.applied != routing.generation:
                work.append(session.push(routing.config(router_id)))
            elif probe:
                work.append(self._probe_then_push(session, routing))
        await asyncio.gather(*work)

    async def _probe_then_push(self, session: RouterSession, routing: SpaceRouting) -> None:
        running = await session.probe()
        if running is not None and running != routing.generation:
            await session.push(routing.config(session.endpoint.router_id))

    async def _forget(self, space: str) -> None:
        for session in self.sessions.pop(space, {}).values():
            await session.close()
        self.spaces.pop(space, None)
        self.elastic.pop(space, None)

    async def _sample_load(
        self, space: str, sessions: dict[str, RouterSession], quotas: resources_pb2.Quotas
    ) -> None:
        """Every `load_every` s, a space whose plan scales by load has its routers' connection
        lists read; a changed router count wakes the next pass, which renders it."""
        if not elastic(quotas) or self.routers_per_space is not None:
            self.elastic.pop(space, None)
            return
        now = time.monotonic()
        if now - self._sampled.get(space, 0.0) < self.load_every:
            return
        self._sampled[space] = now
        answers = await asyncio.gather(*(s.connections() for s in sessions.values()))
        if any(answer is None for answer in answers):
            return  # a router that does not answer: its load is unknown, decide nothing
        up, down = self._scale_after
        counted = self.elastic.setdefault(
            space, Elasticity(routers=len(sessions), up_after=up, down_after=down)
        )
        if counted.observe(load_of([a for a in answers if a], at=now), quotas=quotas):
            log.info("routers scaled", space=space, routers=counted.routers, why=counted.reason)
            self.wake()

    # ------------------------------------------------------------ status

    async def _write_address_statuses(
        self,
        stub: config_pb2_grpc.ConfigServiceStub,
        addresses: list[resources_pb2.Address],
        phases: dict[str, Readiness],
    ) -> int:
        writes: list[StatusWrite] = []
        for address in addresses:
            wanted = phases.get(address.metadata.name)
            status = status_to_write(address, wanted) if wanted is not None else None
            if status is not None and not self._own_writes.pending(address, status):
                writes.append((address, status))
        failures: Counter[str] = Counter()
        for batch in status_batches(writes):
            failures.update(await self._write_batch(stub, batch))
        if writes:
            self._report_failures(addresses[0].metadata.space, failures)
        self.status_writes += len(writes) - failures.total()
        return len(writes) - failures.total()

    async def _write_batch(
        self, stub: config_pb2_grpc.ConfigServiceStub, batch: list[StatusWrite]
    ) -> Counter[str]:
        """One batch of status writes; the failure codes of its writes (none: all written). An
        entry that is stale or deleted meanwhile is left out, as a stale single write is: the
        informer brings the news and the next pass writes on it."""
        try:
            outcome = await write_batch(stub, batch, deadline=STATUS_BATCH_DEADLINE)
        except grpc.aio.AioRpcError as error:
            return Counter({str(error.code().name): len(batch)})
        for (address, status), version in outcome.written:
            self._own_writes.note(address, status, version=version)
        singles = [self._write_address(stub, address, status) for address, status in outcome.rest]
        return Counter(code for code in await asyncio.gather(*singles) if code)

    async def _write_address(
        self,
        stub: config_pb2_grpc.ConfigServiceStub,
        address: resources_pb2.Address,
        status: resources_pb2.AddressStatus,
    ) -> str:
        async with self._status_slots:
            return await _tolerant(self._write_one(stub, address, status))

    async def _write_one(
        self,
        stub: config_pb2_grpc.ConfigServiceStub,
        address: resources_pb2.Address,
        status: resources_pb2.AddressStatus,
    ) -> None:
        request = status_request(address, status)
        written = await stub.UpdateAddressStatus(request, timeout=STATUS_DEADLINE)
        self._own_writes.note(address, status, version=written.metadata.resource_version)

    async def _write_space_status(
        self,
        stub: config_pb2_grpc.ConfigServiceStub,
        space: resources_pb2.AddressSpace,
        routing: SpaceRouting,
        applied: dict[str, int],
        unreachable: set[str],
    ) -> int:
        verdict = space_readiness(
            generation=routing.generation,
            applied=applied,
            routers=routing.routers,
            unreachable=unreachable,
        )
        status = resources_pb2.AddressSpaceStatus()
        status.CopyFrom(space.status)
        status.status.phase = verdict.phase
        status.status.messages[:] = [verdict.message] if verdict.message else []
        status.status.observed_generation = space.metadata.generation
        del status.endpoints[:]
        gateways = self.directory.gateways(space.metadata.name)
        status.endpoints.extend(client_endpoints([*routing.routers, *gateways]))
        if status == space.status:
            return 0
        request = config_pb2.UpdateAddressSpaceStatusRequest(
            ref=config_pb2.ObjectRef(name=space.metadata.name),
            status=status,
            resource_version=space.metadata.resource_version,
        )
        failed = await _tolerant(stub.UpdateAddressSpaceStatus(request, timeout=STATUS_DEADLINE))
        if failed:
            return 0  # the address writes of the same batch failed alike and said so
        self.status_writes += 1
        return 1

    def _report_failures(self, space: str, failures: Counter[str]) -> None:
        """One line when writes start or stop failing, not one per address and pass: a config
        service that is down would otherwise log thousands of lines."""
        signature = ",".join(sorted(failures))
        if signature != self._failing.get(space, ""):
            if failures:
                log.warning("status writes failing", space=space, failures=dict(failures))
            else:
                log.info("status writes succeed again", space=space)
            self._failing[space] = signature

    # ------------------------------------------------------------ what the servicer shows

    def topology(self, space: str = "") -> list[tuple[SpaceRouting, list[RouterSession]]]:
        return [
            (routing, list(self.sessions.get(name, {}).values()))
            for name, routing in sorted(self.spaces.items())
            if not space or name == space
        ]

    async def address_stats(
        self, *, space: str, address: str
    ) -> tuple[list[router_pb2.AddressStats], list[str], list[str]]:
        """(stats summed over the routers that answered, who answered, who did not)."""
        sessions = list(self.sessions.get(space, {}).values())
        answers = await asyncio.gather(*(s.stats(address) for s in sessions))
        totals: dict[str, router_pb2.AddressStats] = {}
        answered, silent = [], []
        for session, stats in zip(sessions, answers, strict=True):
            if stats is None:
                silent.append(session.endpoint.router_id)
                continue
            answered.append(session.endpoint.router_id)
            for entry in stats.addresses:
                _add_into(totals, entry)
        return [totals[a] for a in sorted(totals)], sorted(answered), sorted(silent)


def _render_workloads(
    workloads: RouterWorkloads,
    plans: dict[str, tuple[str, resources_pb2.AddressSpacePlan | None]],
    *,
    override: int | None,
    elastic: Mapping[str, tuple[int, str]],
) -> list[str]:
    """Every standard space (name -> its plan's name and the plan) has its routers rendered; a
    deleted one has them no more; a space scaled by its load (`elastic`: its count and why) has
    as many as that says. Returns why, for each space whose files changed."""
    reasons = []
    for space, (plan_name, plan) in sorted(plans.items()):
        rendered = len(workloads.read_space(space)) if plan is None else 0
        count = router_count(
            space=space, plan_name=plan_name, plan=plan, override=override, rendered=rendered
        )
        if space in elastic and plan is not None and override is None:
            routers, why = elastic[space]
            count = elastic_count(space=space, plan_name=plan_name, routers=routers, why=why)
        if written := workloads.ensure_space(space, routers=count.routers):
            log.info("router workloads rendered", space=space, routers=written, why=count.why)
            reasons.append(count.why)
    for space in workloads.spaces():
        if space not in plans and (removed := workloads.remove_space(space)):
            log.info("router workloads removed", space=space, routers=removed)
            reasons.append(f"space {space} deleted: remove {', '.join(removed)}")
    return reasons


def _add_into(totals: dict[str, router_pb2.AddressStats], entry: router_pb2.AddressStats) -> None:
    total = totals.setdefault(
        entry.address, router_pb2.AddressStats(address=entry.address, type=entry.type)
    )
    for counter in COUNTERS:
        setattr(total, counter, getattr(total, counter) + getattr(entry, counter))
    # every router sees the same mesh: the number of routers with consumers is not a sum
    total.remote_routers = max(total.remote_routers, entry.remote_routers)


async def _tolerant(call: Awaitable[Any]) -> str:
    """The write's failure code name, or "" when it was written or need not be.

    ABORTED (somebody wrote in between) and NOT_FOUND (deleted meanwhile) are not failures: the
    informer brings the news and the next pass writes on top of it."""
    try:
        await call
    except grpc.aio.AioRpcError as error:
        if error.code() not in (grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND):
            return str(error.code().name)
    return ""
