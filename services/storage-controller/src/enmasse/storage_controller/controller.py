"""The reconcile loop: declared addresses and plans in, brokers rendered and stocked, statuses out.

In: the config service's resources through an `Informer` (addresses, address spaces, plans, and
messaging users with their secrets: this controller's identity is `controller`), the
brokers' BrokerAdmin (found through a `Directory`, see `broker_endpoint`). Out: broker workloads
in the GitOps output, queues and topics ensured (with their plan) on the brokers that hold them,
messages drained off brokers that are leaving, a brokered space's client access on its broker,
and `status.brokers` (each broker `waiting` for
the address or not) / phase / messages of every Address.

One pass over one space (`reconcile_space`), in this order, each step safe to repeat:
1. place: the pure `place()` from the space's addresses, plans, space plan and the last placement
   (kept in memory; after a restart rebuilt from the rendered files and the statuses written);
2. render every broker of the placement (new ones get free loopback ports) into the output;
3. ensure: for every Active broker that answers, list what it has and ensure what it lacks or
   holds with another plan; delete the queues and topics of deleted addresses;
4. drain: for every address leaving a broker, once its new broker holds it, `Drain` the old one
   into it (with the new one's BrokerAdmin, so it gets what it lacks), then check the old one
   holds none of it any more; only then is the move done (a broker that does not answer is never
   reported drained). A queue moves its messages; a topic its durable subscriptions with what
   waits in them and what their consumers hold unsettled, into the same subscriptions on the
   new broker, so a durable subscriber that comes back finds everything there; a `subscription`
   address's move is done with its topic's. A Draining broker with no moves left is dropped,
   and its file removed, so the runtime stops it;
5. statuses: write what changed, many to a call (`enmasse.resources.status_batches`;
   compare-and-swap on the version seen; an address that lost a race leaves its batch and is
   written on its own, re-read),
   with the dead letters the brokers count for each address (`statuses.dead_letters_of`).
   Brokers count dead letters without telling anyone, so while nothing else happens every space
   is passed over again every `figures_interval` to read them.
   A brokered space has no routers (its clients talk to its one broker), so here its addresses
   turn Active once the broker holds them, and its AddressSpace status turns Active with the
   broker's AMQP endpoint (from the directory: the broker's own ports file when there is one)
   once the broker answers and holds the space's client access. Standard spaces' phases and
   endpoints are the router-agent's.
A brokered space's broker is the space's client endpoint: after step 3 each pass makes sure it
holds the space's client access (its MessagingUsers with their hashes, SCRAM keys and rules, the
plan's login policy and limits: `client_access.py`), pushed with SetClientAccess where it holds
another version. The broker keeps it in memory only, so while nothing changes brokered spaces'
brokers are asked every `access_check_interval` which version they hold, and a restarted one is
pushed to again.
A broker gets at most ENSURE_BUDGET ensure calls a pass (brokers side by side); the rest wait for
the next pass, which follows at once, so thousands of new addresses get their statuses in slices
instead of all at the end. A space whose pass left work undone (a broker not up yet, a drain to
finish) is passed over again every `resync_interval`; any change from the informer triggers a
pass at once. Deleting an address space removes its brokers' files (its messages go with it: the
user deleted them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import grpc
import structlog
from enmasse.common.certificates import TlsFiles
from enmasse.common.credentials import TokenSource, config_channel, peer_channel
from enmasse.common.metrics import LoopMetrics
from enmasse.common.ports import unclaimed_port
from enmasse.resources.contracts import ACTIVE, STORED_TYPES, SUBSCRIPTION_SEPARATOR
from enmasse.resources.discovery import LOOPBACK, BrokerEndpoint, Directory
from enmasse.resources.gitops_writeback import WorkloadRepository
from enmasse.resources.informer import Informer
from enmasse.resources.kinds import object_of
from enmasse.resources.rendered_brokers import BrokerWorkload, GitOpsOutput, LocalPorts
from enmasse.resources.status_batches import (
    STATUS_BATCH_DEADLINE,
    StatusWrite,
    status_batches,
    write_batch,
)
from enmasse.storage_controller.client_access import access_to_push, client_access
from enmasse.storage_controller.gitops_writeback import change_reasons
from enmasse.storage_controller.placement import Placement, place
from enmasse.storage_controller.statuses import (
    address_status,
    dead_letters_of,
    recorded_placement,
    space_status,
)
from enmasse.storage_controller.workloads import render_broker
from enmasse.v1 import broker_pb2, broker_pb2_grpc, config_pb2, config_pb2_grpc, resources_pb2

log = structlog.get_logger("enmasse.storage_controller")
T = TypeVar("T")

KINDS = ("AddressSpacePlan", "AddressPlan", "AddressSpace", "Address", "MessagingUser")
RPC_TIMEOUT = 5.0
PROBE_TIMEOUT = 2.0
DRAIN_TIMEOUT = 120.0
# While nothing changes, how often brokered spaces' brokers are asked which client access they
# hold (a restarted broker holds none, and lets nobody in until it gets it again).
ACCESS_CHECK_INTERVAL = 2.0
# While nothing changes, how often every space is passed over to read its brokers' dead-letter
# counts into the addresses' statuses.
FIGURES_INTERVAL = 20.0  # dead-letter counts in statuses lag by this much; metrics do not
CONCURRENCY = 16
ENSURE_BUDGET = 100
# A broker that is not up yet is asked again every pass: gRPC's default reconnect back-off
# (up to two minutes) would hide a broker that just came up.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
PLAN_FIELDS = (
    "persistent",
    "memory_limit_bytes",
    "default_ttl_ms",
    "max_delivery_attempts",
    "dead_letter_address",
    "expiry_address",
)


@dataclass
class SpacePass:
    """What one pass over a space found: which broker holds which address, who refused what."""

    ready: dict[str, set[str]] = field(default_factory=dict)  # address name -> brokers holding it
    refusals: dict[str, str] = field(default_factory=dict)
    up: dict[str, broker_pb2.ListAddressesResponse] = field(default_factory=dict)
    settled: bool = True
    deferred: set[str] = field(default_factory=set)  # addresses left for the next pass
    access: set[str] = field(default_factory=set)  # brokers holding the space's client access


@dataclass
class _Budget:
    """How many ensure calls one broker may still get in this pass."""

    left: int

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


@dataclass(frozen=True)
class _Known:
    """What a deletion needs to know of an address after it is gone."""

    address: str
    type: str
    brokers: tuple[str, ...]


class StorageController:
    def __init__(
        self,
        *,
        config_target: str | Callable[[], str],
        output: GitOpsOutput,
        directory: Directory | None,
        space: str = "",
        pick_port: Callable[[], int] = unclaimed_port,
        resync_interval: float = 1.0,
        writeback: WorkloadRepository | None = None,
        token: TokenSource | None = None,
        tls: TlsFiles | None = None,
        access_check_interval: float = ACCESS_CHECK_INTERVAL,
        figures_interval: float = FIGURES_INTERVAL,
    ) -> None:
        self.config_target = config_target
        self.figures_interval = figures_interval
        self._figures_read = 0.0  # time.monotonic() of the last pass over every space
        self.access_check_interval = access_check_interval
        self._token = token
        self._tls = tls  # this controller's certificate: to config and to every BrokerAdmin
        self.output = output
        self.directory = directory
        self.space_filter = space
        self.pick_port = pick_port
        self.resync_interval = resync_interval
        self.writeback = writeback
        self.informer = Informer(
            target=config_target,
            kinds=KINDS,
            token=token,
            tls=tls,
            with_secrets=True,  # users' hashes and SCRAM keys, for brokered spaces' brokers
            on_added=self._changed,
            on_modified=self._changed,
            on_deleted=self._changed,
        )
        self.placements: dict[str, Placement] = {}
        self.passes = 0
        self.metrics = LoopMetrics("storage-controller")  # per space: timed, failures
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._known: dict[str, dict[str, _Known]] = {}
        self._deletions: dict[str, list[_Known]] = {}
        self._written: dict[tuple[str, str], tuple[bytes, int]] = {}
        self._hurry = False
        self._endpoints: dict[tuple[str, str], BrokerEndpoint | None] = {}
        self._held: dict[tuple[str, str], set[str]] = {}  # (space, broker): addresses it had
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._config_channel: grpc.aio.Channel | None = None
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ running

    def start(self) -> None:
        self.informer.start()
        self._task = asyncio.get_running_loop().create_task(self.run(), name="reconcile")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.informer.stop()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        if self._config_channel is not None:
            await self._config_channel.close()

    async def run(self) -> None:
        await self.informer.synced.wait()
        self._dirty |= self._all_spaces()
        while True:
            spaces, self._dirty = self._dirty, set()
            self._wake.clear()
            for space in sorted(spaces):
                try:
                    with self.metrics.timed_pass():
                        settled = await self.reconcile_space(space)
                    if not settled:
                        self._dirty.add(space)
                except Exception:
                    log.exception("reconcile failed; retrying", space=space)
                    self._dirty.add(space)
            self.passes += 1
            self.metrics.waiting(len(self._dirty))
            if self._hurry:
                self._hurry = False  # work was cut into slices: the next slice at once
            elif self._dirty:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.resync_interval):
                        await self._wake.wait()
            else:
                await self._idle()
                if not self._wake.is_set() and self._figures_due():
                    self._dirty |= self._all_spaces()

    async def _idle(self) -> None:
        """Waits for the informer's next change. A brokered space's broker holds its clients'
        access in memory only: while there are such spaces, every `access_check_interval` the
        brokers are asked which access they hold, and a space whose broker holds another (it
        restarted) is passed over again, which pushes it."""
        brokered = self._brokered_spaces()
        if not brokered:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.figures_interval):
                    await self._wake.wait()
            return
        try:
            async with asyncio.timeout(self.access_check_interval):
                await self._wake.wait()
        except TimeoutError:
            self._endpoints.clear()
            for space in brokered:
                if await self._access_lost(space):
                    self._dirty.add(space)

    def _figures_due(self) -> bool:
        """Whether it is time to read every space's dead-letter counts again."""
        now = time.monotonic()
        if now - self._figures_read < self.figures_interval:
            return False
        self._figures_read = now
        return True

    def _changed(self, resource: resources_pb2.Resource) -> None:
        kind = resource.WhichOneof("kind")
        obj = object_of(resource)
        if kind == "address":
            spaces = {obj.metadata.space}
        elif kind == "messaging_user":
            # a brokered space's broker is told its users; a standard space's routers are the
            # router-agent's business
            space = self.informer.get("AddressSpace", obj.metadata.space)
            brokered = space is not None and space.address_space.spec.type == "brokered"
            spaces = {obj.metadata.space} if brokered else set()
        elif kind == "address_space":
            spaces = {obj.metadata.name}
        else:
            spaces = self._all_spaces()  # a plan: any space may use it
        self._dirty |= {s for s in spaces if self._wanted(s)}
        self._wake.set()

    def _all_spaces(self) -> set[str]:
        spaces = {r.address_space.metadata.name for r in self.informer.list("AddressSpace")}
        spaces |= set(self.output.spaces()) | set(self.placements)
        return {s for s in spaces if self._wanted(s)}

    def _wanted(self, space: str) -> bool:
        return not self.space_filter or space == self.space_filter

    def _brokered_spaces(self) -> set[str]:
        return {
            r.address_space.metadata.name
            for r in self.informer.list("AddressSpace")
            if r.address_space.spec.type == "brokered"
            and self._wanted(r.address_space.metadata.name)
        }

    # ------------------------------------------------------------ one pass over one space

    async def reconcile_space(self, space: str) -> bool:
        """One pass; True when nothing is left to do for the space."""
        self._endpoints.clear()
        found = self.informer.get("AddressSpace", space)
        if found is None:
            return await self._remove_space(space)
        address_space = found.address_space
        addresses = [r.address for r in self.informer.list("Address", space=space)]
        plans = {
            r.address_plan.metadata.name: r.address_plan for r in self.informer.list("AddressPlan")
        }
        space_plan_resource = self.informer.get("AddressSpacePlan", address_space.spec.plan)
        current = self.placements.get(space)
        if current is None:
            current = recorded_placement(
                space=space, workloads=self.output.read_space(space), addresses=addresses
            )
        placement = place(
            space=space,
            addresses=addresses,
            plans=plans,
            space_plan=space_plan_resource.address_space_plan if space_plan_resource else None,
            current=current,
        )
        self._note_deletions(space, current, addresses)
        self._render(space, placement)
        self.placements[space] = placement
        found_pass = await self._ensure(space, placement, addresses, plans)
        brokered = address_space.spec.type == "brokered"
        if brokered:
            await self._give_access(address_space, placement, found_pass)
        await self._delete_gone(space, found_pass)
        placement = await self._drain(space, placement, addresses, found_pass)
        if placement != self.placements[space]:
            self._render(space, placement)
            self.placements[space] = placement
        await self._write_statuses(space, addresses, placement, found_pass, brokered=brokered)
        if brokered and not await self._write_space_status(address_space, placement, found_pass):
            found_pass.settled = False
        if found_pass.deferred:
            self._hurry = True
        return found_pass.settled and not placement.moves and not self._deletions.get(space)

    async def _remove_space(self, space: str) -> bool:
        removed = self.output.write_space(space, {})
        if removed:
            log.info("address space gone; brokers removed", space=space, brokers=removed)
            self._note_written(space, before={}, placement=None, changed=removed)
        self.placements.pop(space, None)
        self._known.pop(space, None)
        self._deletions.pop(space, None)
        self._held = {key: held for key, held in self._held.items() if key[0] != space}
        return True

    # ------------------------------------------------------------ rendering

    def _render(self, space: str, placement: Placement) -> None:
        rendered = self.output.read_all()
        ports = {bid: w.ports for bid, w in rendered.get(space, {}).items()}
        taken = {
            p
            for ws in rendered.values()
            for w in ws.values()
            for p in (w.ports.amqp, w.ports.admin, w.ports.amqps)
            if p is not None
        }
        found = self.informer.get("AddressSpace", space)
        # A standard space's brokers take only its routers; a brokered space's serve its clients.
        routers_only = found is None or found.address_space.spec.type != "brokered"
        texts = {}
        for broker_id, broker in placement.brokers.items():
            if broker_id not in ports:
                ports[broker_id] = LocalPorts(self._fresh_port(taken), self._fresh_port(taken))
            if not routers_only and ports[broker_id].amqps is None:  # its clients' TLS port
                ports[broker_id] = replace(ports[broker_id], amqps=self._fresh_port(taken))
            texts[broker_id] = render_broker(
                space=space, broker=broker, ports=ports[broker_id], routers_only=routers_only
            )
        changed = self.output.write_space(space, texts)
        if changed:
            log.info("broker workloads rendered", space=space, changed=changed)
            self._note_written(
                space, before=rendered.get(space, {}), placement=placement, changed=changed
            )

    def _note_written(
        self,
        space: str,
        *,
        before: dict[str, BrokerWorkload],
        placement: Placement | None,
        changed: list[str],
    ) -> None:
        # The write-back commits these files with a message saying why they changed.
        if self.writeback is None:
            return
        addresses = [r.address for r in self.informer.list("Address", space=space)]
        self.writeback.note(
            change_reasons(
                space=space,
                before=before,
                placement=placement,
                changed=changed,
                addresses=addresses,
            )
        )

    def _fresh_port(self, taken: set[int]) -> int:
        for _ in range(100):
            port = self.pick_port()
            if port not in taken:
                taken.add(port)
                return port
        raise RuntimeError("no free port found in 100 tries")

    # ------------------------------------------------------------ ensuring queues and topics

    async def _ensure(
        self,
        space: str,
        placement: Placement,
        addresses: Sequence[resources_pb2.Address],
        plans: dict[str, resources_pb2.AddressPlan],
    ) -> SpacePass:
        found = SpacePass()
        by_name = {a.metadata.name: a for a in addresses}
        brokers = list(placement.brokers.values())
        listings = await asyncio.gather(*(self._list(space, b.id) for b in brokers))
        for broker, listing in zip(brokers, listings, strict=True):
            if listing is not None:
                found.up[broker.id] = listing
        active = [b.id for b in brokers if b.state == ACTIVE]
        # brokers are separate processes: stock them side by side
        held = await asyncio.gather(
            *(self._stock(space, b, placement.holders(b), by_name, plans, found) for b in active)
        )
        for broker_id, ready in zip(active, held, strict=True):
            for name in ready:
                found.ready.setdefault(name, set()).add(broker_id)
            self._held[(space, broker_id)] = set(ready)
        return found

    async def _stock(
        self,
        space: str,
        broker_id: str,
        names: list[str],
        by_name: dict[str, resources_pb2.Address],
        plans: dict[str, resources_pb2.AddressPlan],
        found: SpacePass,
    ) -> list[str]:
        """Ensures a broker's queues and topics; the names it now holds."""
        listing = found.up.get(broker_id)
        if listing is None:
            # not answering (restarting, or slow): what it held stays held until it answers
            # otherwise, so a blip does not send thousands of statuses back and forth
            found.settled = False
            held_before = self._held.get((space, broker_id), set())
            return [n for n in names if n in held_before]
        held = {a.name: a for a in listing.addresses}
        stored = [n for n in names if by_name[n].spec.type != "subscription"]
        budget = _Budget(ENSURE_BUDGET)
        done = await _bounded(
            self._ensure_one(space, broker_id, by_name[n], plans, held, found, budget)
            for n in stored
        )
        ready = {name for name, ok in zip(stored, done, strict=True) if ok}
        # a subscription is the subscription service's to create: ready when its topic is
        for name in names:
            spec = by_name[name].spec
            if spec.type == "subscription" and spec.topic in ready:
                ready.add(name)
        return sorted(ready)

    async def _ensure_one(
        self,
        space: str,
        broker_id: str,
        address: resources_pb2.Address,
        plans: dict[str, resources_pb2.AddressPlan],
        held: dict[str, broker_pb2.BrokerAddress],
        found: SpacePass,
        budget: _Budget,
    ) -> bool:
        spec = address.spec
        plan = plans[spec.plan].spec
        have = held.get(spec.address)
        if have is not None and have.kind == spec.type and _same_plan(have.plan, plan):
            return True
        if not budget.take():
            # thousands at once: a pass stocks a slice, writes their statuses, and goes on
            found.deferred.add(address.metadata.name)
            found.settled = False
            return False
        request = broker_pb2.EnsureAddressRequest(name=spec.address, plan=plan)
        stub = self._broker_stub(space, broker_id)
        if stub is None:
            found.settled = False
            return False
        ensure = stub.EnsureQueue if spec.type == "queue" else stub.EnsureTopic
        try:
            await ensure(request, timeout=RPC_TIMEOUT)
        except grpc.aio.AioRpcError as error:
            if error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS):
                found.refusals[address.metadata.name] = (
                    f"broker {broker_id} refused {spec.type} '{spec.address}': {error.details()}"
                )
            else:
                found.settled = False
            log.warning(
                "ensure failed",
                space=space,
                broker=broker_id,
                address=spec.address,
                code=error.code().name,
                error=error.details(),
            )
            return False
        log.info("ensured", space=space, broker=broker_id, address=spec.address, type=spec.type)
        return True

    async def _list(self, space: str, broker_id: str) -> broker_pb2.ListAddressesResponse | None:
        """The broker's addresses, or None when it does not answer (not running yet, or down)."""
        stub = self._broker_stub(space, broker_id)
        if stub is None:
            return None
        try:
            listing: broker_pb2.ListAddressesResponse = await stub.ListAddresses(
                broker_pb2.ListAddressesRequest(), timeout=PROBE_TIMEOUT
            )
            return listing
        except grpc.aio.AioRpcError:
            return None

    def _endpoint(self, space: str, broker_id: str) -> BrokerEndpoint | None:
        """Asked once per broker and pass: a directory may read files to answer."""
        key = (space, broker_id)
        if key not in self._endpoints:
            self._endpoints[key] = broker_endpoint(
                space, broker_id, directory=self.directory, output=self.output
            )
        return self._endpoints[key]

    def _broker_stub(self, space: str, broker_id: str) -> broker_pb2_grpc.BrokerAdminStub | None:
        endpoint = self._endpoint(space, broker_id)
        if endpoint is None:
            return None
        channel = self._channels.get(endpoint.admin)
        if channel is None:
            channel = peer_channel(endpoint.admin, tls=self._tls, options=CHANNEL_OPTIONS)
            self._channels[endpoint.admin] = channel
        return broker_pb2_grpc.BrokerAdminStub(channel)

    # ------------------------------------------------------------ a brokered space's clients

    def _client_access(self, address_space: resources_pb2.AddressSpace) -> broker_pb2.ClientAccess:
        """The access the space's broker must hold now: its users, its plan's policy and limits."""
        name = address_space.metadata.name
        plan = self.informer.get("AddressSpacePlan", address_space.spec.plan)
        return client_access(
            space=name,
            plan=plan.address_space_plan if plan is not None else None,
            users=[r.messaging_user for r in self.informer.list("MessagingUser", space=name)],
        )

    async def _give_access(
        self, address_space: resources_pb2.AddressSpace, placement: Placement, found: SpacePass
    ) -> None:
        """Every Active broker of a brokered space that answered holds the space's client access
        after this (pushed where it held another: users or the plan changed, or it restarted);
        `found.access` says which do."""
        space = address_space.metadata.name
        wanted = self._client_access(address_space)
        for broker in placement.brokers.values():
            listing = found.up.get(broker.id)
            if broker.state != ACTIVE or listing is None:
                continue
            push = access_to_push(wanted, held=listing.client_access_version)
            if push is None or await self._push_access(space, broker.id, push):
                found.access.add(broker.id)
            else:
                found.settled = False

    async def _push_access(
        self, space: str, broker_id: str, access: broker_pb2.ClientAccess
    ) -> bool:
        stub = self._broker_stub(space, broker_id)
        if stub is None:
            return False
        try:
            await stub.SetClientAccess(access, timeout=RPC_TIMEOUT)
        except grpc.aio.AioRpcError as error:
            log.warning(
                "client access not pushed",
                space=space,
                broker=broker_id,
                code=error.code().name,
                error=error.details(),
            )
            return False
        log.info(
            "client access pushed",
            space=space,
            broker=broker_id,
            version=access.version[:12],
            users=len(access.users),
        )
        return True

    async def _access_lost(self, space: str) -> bool:
        """True when an Active broker of the (brokered) space answers holding another access
        than the space calls for: a pass must push it."""
        found = self.informer.get("AddressSpace", space)
        placement = self.placements.get(space)
        if found is None or placement is None:
            return False
        wanted = self._client_access(found.address_space)
        for broker in placement.brokers.values():
            if broker.state != ACTIVE:
                continue
            listing = await self._list(space, broker.id)
            if listing is not None and access_to_push(wanted, held=listing.client_access_version):
                return True
        return False

    # ------------------------------------------------------------ deleted addresses

    def _note_deletions(
        self, space: str, current: Placement, addresses: Sequence[resources_pb2.Address]
    ) -> None:
        """Remembers, for each address that vanished, where its queue or topic must go."""
        alive = {a.metadata.name for a in addresses}
        known = self._known.setdefault(space, {})
        for name in [n for n in known if n not in alive]:
            gone = known.pop(name)
            if gone.type in ("queue", "topic"):
                self._deletions.setdefault(space, []).append(gone)
        for address in addresses:
            name = address.metadata.name
            if address.spec.type in STORED_TYPES:
                held = (*current.addresses.get(name, ()), *current.moves.get(name, ()))
                known[name] = _Known(address.spec.address, address.spec.type, held)

    async def _delete_gone(self, space: str, found: SpacePass) -> None:
        remaining = []
        for gone in self._deletions.get(space, []):
            left = [b for b in gone.brokers if b in self.placements[space].brokers]
            undone = [b for b in left if not await self._delete_on(space, b, gone, found)]
            if undone:
                remaining.append(_Known(gone.address, gone.type, tuple(undone)))
        self._deletions[space] = remaining

    async def _delete_on(self, space: str, broker_id: str, gone: _Known, found: SpacePass) -> bool:
        listing = found.up.get(broker_id)
        if listing is None:
            return False
        if not any(a.name == gone.address for a in listing.addresses):
            return True
        stub = self._broker_stub(space, broker_id)
        if stub is None:
            return False
        delete = stub.DeleteQueue if gone.type == "queue" else stub.DeleteTopic
        try:
            answer = await delete(
                broker_pb2.DeleteAddressRequest(name=gone.address), timeout=RPC_TIMEOUT
            )
        except grpc.aio.AioRpcError as error:
            return error.code() == grpc.StatusCode.NOT_FOUND
        log.info(
            "deleted",
            space=space,
            broker=broker_id,
            address=gone.address,
            messages_deleted=answer.messages_deleted,
        )
        return True

    # ------------------------------------------------------------ draining

    async def _drain(
        self,
        space: str,
        placement: Placement,
        addresses: Sequence[resources_pb2.Address],
        found: SpacePass,
    ) -> Placement:
        by_name = {a.metadata.name: a for a in addresses}
        # subscriptions last: theirs is done once their topic's drain from that broker is
        for name, leaving in sorted(placement.moves.items(), key=_subscriptions_last(by_name)):
            targets = placement.addresses.get(name, ())
            address = by_name.get(name)
            if address is None or not targets or targets[0] not in found.ready.get(name, set()):
                continue  # nowhere to hand over to yet
            for source in leaving:
                if address.spec.type == "subscription":
                    # its durable subscription (`<topic>::<name>`) travels with the topic
                    done = source not in placement.moves.get(address.spec.topic, ())
                else:
                    done = await self._move(
                        space, address, source=source, target=targets[0], found=found
                    )
                if done:
                    placement = placement.move_done(name, source)
                    log.info("move done", space=space, address=name, source=source)
        return placement

    async def _move(
        self,
        space: str,
        address: resources_pb2.Address,
        *,
        source: str,
        target: str,
        found: SpacePass,
    ) -> bool:
        """Hands a queue's messages, or a topic's durable subscriptions with theirs, from
        `source` to `target`; True only when `source` answered that it holds none of them any
        more."""
        spec = address.spec
        if source not in found.up:
            return False  # down: never reported drained
        target_endpoint = self._endpoint(space, target)
        stub = self._broker_stub(space, source)
        if target_endpoint is None or stub is None:
            return False
        if not await self._drain_address(stub, spec, target_endpoint, space, source):
            return False
        listing = await self._list(space, source)
        if listing is None or still_holds(listing, spec):
            return False  # unsettled deliveries still out, or new arrivals: next pass
        staying = self.placements[space].brokers.get(source)
        present = any(a.name == spec.address for a in listing.addresses)
        if present and staying is not None and staying.state == ACTIVE:
            # the broker stays for others: the moved address must not linger there
            delete = stub.DeleteQueue if spec.type == "queue" else stub.DeleteTopic
            with contextlib.suppress(grpc.aio.AioRpcError):
                await delete(
                    broker_pb2.DeleteAddressRequest(name=spec.address), timeout=RPC_TIMEOUT
                )
        return True

    async def _drain_address(
        self,
        stub: broker_pb2_grpc.BrokerAdminStub,
        spec: resources_pb2.AddressSpec,
        target: BrokerEndpoint,
        space: str,
        source: str,
    ) -> bool:
        request = broker_pb2.DrainRequest(
            target_host=target.host,
            target_port=target.amqp_port,
            addresses=[spec.address],
            # the target gets the queue, or the topic and its durable subscriptions (same
            # plan), if it lacks them; a topic cannot be drained without it
            target_admin=target.admin,
        )
        try:
            answer = await stub.Drain(request, timeout=DRAIN_TIMEOUT)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return True  # nothing of it there
            log.warning(
                "drain failed",
                space=space,
                broker=source,
                address=spec.address,
                type=spec.type,
                error=error.details(),
            )
            return False
        log.info(
            "drained",
            space=space,
            broker=source,
            address=spec.address,
            type=spec.type,
            moved=answer.messages_moved,
            queues=list(answer.addresses),
        )
        return True

    # ------------------------------------------------------------ statuses

    async def _write_statuses(
        self,
        space: str,
        addresses: Iterable[resources_pb2.Address],
        placement: Placement,
        found: SpacePass,
        *,
        brokered: bool,
    ) -> None:
        changes: list[StatusWrite] = []
        addresses = list(addresses)
        topics = {a.metadata.name: a.spec.address for a in addresses if a.spec.type == "topic"}
        listed = {
            broker: {a.name: a for a in listing.addresses} for broker, listing in found.up.items()
        }
        for address in addresses:
            name = address.metadata.name
            if address.spec.type not in STORED_TYPES or name in found.deferred:
                continue
            spec = address.spec
            node = spec.address
            if spec.type == "subscription":
                node = f"{topics.get(spec.topic, spec.topic)}{SUBSCRIPTION_SEPARATOR}{node}"
            brokers = (*placement.addresses.get(name, ()), *placement.moves.get(name, ()))
            desired = address_status(
                address=address,
                placement=placement,
                ready=found.ready.get(name, set()),
                refusal=found.refusals.get(name, ""),
                brokered=brokered,
                dead_letters=dead_letters_of(node, [listed.get(b) for b in brokers]),
            )
            if desired != address.status and not self._written_already(address, desired):
                changes.append((address, desired))
        for batch in status_batches(changes):
            await self._write_batch(batch)

    def _written_already(
        self, address: resources_pb2.Address, desired: resources_pb2.AddressStatus
    ) -> bool:
        """Whether this is our own last write, which the informer has not brought back yet."""
        last = self._written.get((address.metadata.space, address.metadata.name))
        wire = desired.SerializeToString(deterministic=True)
        return last is not None and last[0] == wire and address.metadata.resource_version < last[1]

    async def _write_batch(self, batch: list[StatusWrite]) -> None:
        """One batch of status writes. An entry that lost a race (stale, or deleted meanwhile)
        is left out of it and written on its own, re-read and retried as always."""
        try:
            outcome = await write_batch(self._config_stub(), batch, deadline=STATUS_BATCH_DEADLINE)
        except grpc.aio.AioRpcError:
            await self._drop_config_channel()  # config may be back on another port
            raise
        for (address, desired), version in outcome.written:
            self._note_status(address, desired, version=version)
        alone = [*outcome.refused, *outcome.rest]
        await _bounded(self._write_status(address, desired) for address, desired in alone)

    def _note_status(
        self,
        address: resources_pb2.Address,
        desired: resources_pb2.AddressStatus,
        *,
        version: int,
    ) -> None:
        key = (address.metadata.space, address.metadata.name)
        self._written[key] = (desired.SerializeToString(deterministic=True), version)
        log.info(
            "address status written",
            space=key[0],
            address=key[1],
            phase=desired.status.phase,
            brokers=[b.broker for b in desired.brokers],
        )

    async def _write_status(
        self, address: resources_pb2.Address, desired: resources_pb2.AddressStatus
    ) -> None:
        key = (address.metadata.space, address.metadata.name)
        stub = self._config_stub()
        ref = config_pb2.ObjectRef(space=key[0], name=key[1])
        version = address.metadata.resource_version
        for _attempt in range(3):
            try:
                written = await stub.UpdateAddressStatus(
                    config_pb2.UpdateAddressStatusRequest(
                        ref=ref, status=desired, resource_version=version
                    ),
                    timeout=RPC_TIMEOUT,
                )
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.NOT_FOUND:
                    return
                if error.code() != grpc.StatusCode.ABORTED:
                    await self._drop_config_channel()  # config may be back on another port
                    raise
                fresh = await stub.GetAddress(ref, timeout=RPC_TIMEOUT)
                if fresh.metadata.generation != address.metadata.generation:
                    return  # the spec changed under us: the next pass computes anew
                version = fresh.metadata.resource_version
                continue
            self._note_status(address, desired, version=written.metadata.resource_version)
            return

    async def _write_space_status(
        self, address_space: resources_pb2.AddressSpace, placement: Placement, found: SpacePass
    ) -> bool:
        """A brokered space's phase and endpoint; False when the write lost a race (retry)."""
        name = address_space.metadata.name
        desired = space_status(
            space=address_space,
            placement=placement,
            broker=self._answering_amqp(name, placement, found),
        )
        if desired == address_space.status:
            return True
        key = ("", name)
        wire = desired.SerializeToString(deterministic=True)
        last = self._written.get(key)
        if (
            last is not None
            and last[0] == wire
            and address_space.metadata.resource_version < last[1]
        ):
            return True  # the informer has not caught up with our own write yet
        request = config_pb2.UpdateAddressSpaceStatusRequest(
            ref=config_pb2.ObjectRef(name=name),
            status=desired,
            resource_version=address_space.metadata.resource_version,
        )
        try:
            written = await self._config_stub().UpdateAddressSpaceStatus(
                request, timeout=RPC_TIMEOUT
            )
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return True  # the space is going: its deletion triggers the next pass
            if error.code() == grpc.StatusCode.ABORTED:
                return False  # the informer brings the newer version; the retry writes on it
            await self._drop_config_channel()
            raise
        self._written[key] = (wire, written.metadata.resource_version)
        log.info(
            "address space status written",
            space=name,
            phase=desired.status.phase,
            endpoints=[f"{e.host}:{e.port}" for e in desired.endpoints],
        )
        return True

    def _answering_amqp(
        self, space: str, placement: Placement, found: SpacePass
    ) -> BrokerEndpoint | None:
        """Where the space's broker takes AMQP clients (amqp, and amqps), or None while it does
        not answer or does not hold the space's client access yet (it would let nobody in)."""
        answering = sorted(
            b.id for b in placement.brokers.values() if b.state == ACTIVE and b.id in found.access
        )
        return self._endpoint(space, answering[0]) if answering else None

    async def _drop_config_channel(self) -> None:
        if self._config_channel is not None:
            await self._config_channel.close()
            self._config_channel = None

    def _config_stub(self) -> config_pb2_grpc.ConfigServiceStub:
        if self._config_channel is None:
            target = self.config_target() if callable(self.config_target) else self.config_target
            self._config_channel = config_channel(
                target, token=self._token, options=CHANNEL_OPTIONS, tls=self._tls
            )
        return config_pb2_grpc.ConfigServiceStub(self._config_channel)


async def _bounded(calls: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Runs the calls at most CONCURRENCY at a time (thousands of addresses, one RPC each)."""
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(call: Coroutine[Any, Any, T]) -> T:
        async with limit:
            return await call

    return list(await asyncio.gather(*(one(c) for c in calls)))


def still_holds(listing: broker_pb2.ListAddressesResponse, spec: resources_pb2.AddressSpec) -> bool:
    """Does a broker still hold messages of the address (ready or unsettled)? A topic's are
    those of its durable subscriptions: a non-durable one dies with its link and never moves."""
    prefix = f"{spec.address}{SUBSCRIPTION_SEPARATOR}"
    for held in listing.addresses:
        if spec.type == "topic":
            mine = held.kind == "subscription" and held.durable and held.name.startswith(prefix)
        else:
            mine = held.name == spec.address
        if mine and (held.depth or held.bytes):
            return True
    return False


def _subscriptions_last(
    by_name: dict[str, resources_pb2.Address],
) -> Callable[[tuple[str, tuple[str, ...]]], tuple[bool, str]]:
    def key(move: tuple[str, tuple[str, ...]]) -> tuple[bool, str]:
        address = by_name.get(move[0])
        return (address is not None and address.spec.type == "subscription", move[0])

    return key


def _same_plan(have: resources_pb2.AddressPlanSpec, want: resources_pb2.AddressPlanSpec) -> bool:
    return all(getattr(have, f) == getattr(want, f) for f in PLAN_FIELDS)


def broker_endpoint(
    space: str, broker_id: str, *, directory: Directory | None, output: GitOpsOutput
) -> BrokerEndpoint | None:
    """Where a broker listens: where it says it does (the directory: locally its own ports file),
    or else where its rendered manifest pins it (the local ports annotations, on loopback); None
    for a broker neither knows. No directory (no local runtime): the manifest alone answers."""
    said = directory.broker(space, broker_id) if directory is not None else None
    if said is not None:
        return said
    workload = output.read_space(space).get(broker_id)
    if workload is None:
        return None
    ports = workload.ports
    return BrokerEndpoint(broker_id, LOOPBACK, ports.amqp, ports.admin, amqps_port=ports.amqps)
