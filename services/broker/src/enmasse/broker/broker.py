"""The broker's domain root: owns queues, topics, the journal and the address catalog.

What flows in: admin changes (ensure/delete queue or topic), published messages (`publish`),
subscriptions (`subscribe`/`unsubscribe`), the clock (`reap`). What flows out: entries into queues
(and from there to consumers), journal records, catalog writes, and the answer to "may the producer
be settled now?": `publish` returns True when the broker already owns the message (in memory), or
False when the producer must wait for `on_owned` (called after the group commit's fsync).

Every entry that leaves a queue comes back here (`_removed`): a journaled one is acknowledged in the
journal; a dead letter (rejected, or out of attempts) moves to the plan's dead-letter address; an
expired one moves to the plan's expiry address or is dropped. A dead letter is never dropped: with
no queue of its dead-letter address on this broker (none named, not created yet, or the queue is
its own dead-letter address) it is held in its queue (`Queue.hold_dead`: never delivered again,
counted, in ListAddresses), journaled as held so a restart keeps it held, logged once per queue
as it starts holding, and moved to the dead-letter queue as soon as one is ensured here
(`_rehome_dead_letters`). A journaled entry that comes back with a new delivery count
(`_counted`) gets a COUNT record, so the count and the dead-letter rule survive a restart. No
network here: tests drive it directly, the AMQP handler and the admin servicer sit on top.

As the target of a drain (`prepare_drain`, see inbox.py) it creates the addresses the source
will move, with the same plans and durable subscriptions, and issues the token that lets the
drain's connection send into subscription queues (`publish` to `<topic>::<identity>`).

A dynamic queue (`create_dynamic_queue`: a receiver asked for a dynamic source) is named by the
space's one rule for reply addresses (`contracts.ReplyAddresses`, `_dynamic/<owner>/<life>.<n>`),
lives in memory only (a non-persistent plan: never journaled, never in the catalog, never in
ListAddresses) for as long as the AMQP side keeps it, and is gone with what it holds when
`drop_dynamic_queue` is called (its link or connection ended). It is found by name like any
queue (`find_queue`), looked for only after the named queues and topics.

A message that asks for a delivery time or a group (`asks.py`: `x-opt-delivery-time` /
`x-opt-delivery-delay`, `group-id`) is enqueued through `_admit`: a delay is rewritten into an
absolute time in the bytes before the journal sees them; a scheduled entry waits in its queue
and the `Scheduler` (schedule.py, one loop timer) calls `release_due` at its time; at start the
journal's messages are read again for both, so a scheduled one is scheduled again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import structlog
from enmasse.amqp import codec
from enmasse.amqp.selector import Selector, SelectorError, compile_selector
from enmasse.broker.asks import PROPERTIES_CODE, Asks, asks_of
from enmasse.broker.catalog import Catalog, CatalogData
from enmasse.broker.entry import (
    DEAD_LETTERED,
    DEFAULT_PRIORITY,
    EXPIRED,
    Entry,
    Removal,
    priority_of,
)
from enmasse.broker.facts import message_facts
from enmasse.broker.inbox import DrainTokens, InboxAddress, identity_problem
from enmasse.broker.journal import DEAD_LETTER_HELD, Journal, Recovered
from enmasse.broker.plan import Plan
from enmasse.broker.queue import MemoryBudget, Queue
from enmasse.broker.schedule import Scheduler
from enmasse.broker.topic import Subscription, Topic
from enmasse.resources.contracts import DYNAMIC_PREFIX, SUBSCRIPTION_SEPARATOR, ReplyAddresses
from enmasse.resources.validation import address_problem

log = structlog.get_logger(__name__)


class AddressError(Exception):
    """A refused request, in the words the user sees (AMQP condition text, gRPC details)."""


class InvalidName(AddressError):
    pass


class NotFound(AddressError):
    pass


class Conflict(AddressError):
    pass


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a queue or topic name, or None when it can: the address rule the
    config service checks `spec.address` with (`enmasse.resources.validation.address_problem`)."""
    if not name:
        return "address name must not be empty"
    problem = address_problem(name)
    return f"address name is invalid: {problem}" if problem else None


def now_ms() -> int:
    return int(time.time() * 1000)


class Broker:
    def __init__(
        self,
        *,
        data_dir: Path | None = None,
        memory_limit_bytes: int = 0,
        segment_bytes: int = 64 << 20,
    ) -> None:
        self.budget = MemoryBudget(memory_limit_bytes)
        self.queues: dict[str, Queue] = {}
        self.topics: dict[str, Topic] = {}
        self.journal = (
            Journal(data_dir / "journal", segment_bytes=segment_bytes) if data_dir else None
        )
        self._catalog = Catalog(data_dir / "addresses.json" if data_dir else None)
        self._next_id = 1
        self._room_waiters: list[Callable[[], None]] = []
        # Set by the AMQP side: hand new messages to consumers once per loop turn, in a batch,
        # instead of once per message. Unset (tests of the domain): dispatch at once.
        self.dispatch_later: Callable[[Queue], None] | None = None
        self.recovered = Recovered()
        self.drain_tokens = DrainTokens()
        self._holding: set[Queue] = set()  # queues holding dead letters with nowhere to go
        self.dynamic: dict[str, Queue] = {}  # temporary queues, by their `_dynamic/...` name
        self._reply_addresses = ReplyAddresses("broker")
        # Scheduled delivery (schedule.py): the AMQP side gives it the loop (`use_loop`).
        self.scheduler = Scheduler[Queue](clock=now_ms)
        self.scheduler.on_due = self.release_due

    # ------------------------------------------------------------------ start

    def start(self) -> Recovered:
        """Loads the catalog, then replays the journal into the queues, in id order."""
        data = self._catalog.load()
        for name, plan in data.queues.items():
            self.queues[name] = self._new_queue(name, plan)
        for name, plan in data.topics.items():
            topic = self._new_topic(name, plan)
            for identity in data.durable_subscriptions.get(name, []):
                selector = _recovered_selector(data, topic=name, identity=identity)
                topic.subscribe(identity=identity, durable=True, selector=selector)
        if self.journal is None:
            return self.recovered
        self.recovered = self.journal.recover()
        self._next_id = self.recovered.next_id
        counts = self.recovered.counts
        for queue_name, messages in self.recovered.messages.items():
            queue = self.find_queue(queue_name)
            for msg_id, payload, expires_at in messages:
                if queue is None:
                    self.journal.ack(msg_id=msg_id, queue=queue_name)
                    continue
                entry = Entry(id=msg_id, payload=payload, journaled=True, expires_at=expires_at)
                count = counts.get((queue_name, msg_id))
                if count is not None and count[1] == DEAD_LETTER_HELD:
                    entry.delivery_count = count[0]
                    queue.hold_dead(entry)
                    self._holding.add(queue)
                    continue
                if count is not None:
                    entry.delivery_count, entry.failed_attempts = count
                asks = asks_of(payload)  # its due time is in its bytes: scheduled again
                if asks is not None:
                    self._admit(queue, entry, asks, _recovered_priority(payload))
                else:
                    queue.enqueue_with_priority(entry, _recovered_priority(payload))
            if queue is None:
                log.warning("journal held messages of a queue that is gone", queue=queue_name)
        self._rehome_dead_letters()
        self.journal.commit()
        return self.recovered

    def close(self) -> None:
        self._catalog.close()
        if self.journal is not None:
            self.journal.close()

    # ------------------------------------------------------------------ admin

    def ensure_queue(self, name: str, plan: Plan, *, commit: bool = True) -> Queue:
        """The queue, created or given this plan. commit=False leaves the catalog change
        buffered: the caller must `commit_catalog()` before telling anyone it is done."""
        self._check(name, plan)
        if name in self.topics:
            raise Conflict(f"{name!r} is a topic on this broker, not a queue")
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = self._new_queue(name, plan)
        elif queue.plan == plan:
            return queue  # nothing to write; a reconcile pass asks again and again
        queue.plan = plan
        self._catalog.put_queue(name, plan)
        if commit:
            self.commit_catalog()
        if self._holding:
            self._rehome_dead_letters()  # this may be the dead-letter queue they waited for
        return queue

    def ensure_topic(self, name: str, plan: Plan, *, commit: bool = True) -> Topic:
        """The topic, created or given this plan; commit=False as for `ensure_queue`."""
        self._check(name, plan)
        if name in self.queues:
            raise Conflict(f"{name!r} is a queue on this broker, not a topic")
        topic = self.topics.get(name)
        if topic is None:
            topic = self._new_topic(name, plan)
        elif topic.plan == plan:
            return topic
        topic.plan = plan
        for sub in topic.subscriptions.values():
            sub.queue.plan = plan
        self._catalog.put_topic(name, plan)
        if commit:
            self.commit_catalog()
        if self._holding:
            self._rehome_dead_letters()  # its plan may name a dead-letter queue that exists
        return topic

    def commit_catalog(self) -> None:
        """Makes every catalog change so far durable (one append + fsync for all of them)."""
        self._catalog.commit()

    def delete_queue(self, name: str) -> int:
        queue = self.queues.pop(name, None)
        if queue is None:
            raise NotFound(f"no queue {name!r} on this broker")
        gone = queue.purge()
        self._catalog.drop_queue(name)
        self.commit_catalog()
        return gone

    def delete_topic(self, name: str) -> int:
        topic = self.topics.pop(name, None)
        if topic is None:
            raise NotFound(f"no topic {name!r} on this broker")
        gone = 0
        for identity, sub in list(topic.subscriptions.items()):
            gone += sub.queue.depth
            topic.unsubscribe(identity)
        self._catalog.drop_topic(name)
        self.commit_catalog()
        return gone

    def create_dynamic_queue(self) -> Queue:
        """A new temporary queue with a unique `_dynamic/...` name: in memory, never journaled."""
        name = self._reply_addresses.allocate()
        queue = self.dynamic[name] = self._new_queue(name, DYNAMIC_PLAN)
        return queue

    def drop_dynamic_queue(self, name: str) -> int:
        """The temporary queue and what it holds are gone; returns how many messages went."""
        queue = self.dynamic.pop(name, None)
        return queue.purge() if queue is not None else 0

    def _check(self, name: str, plan: Plan) -> None:
        problem = name_problem(name)
        if problem:
            raise InvalidName(problem)
        problems = plan.problems()
        if problems:
            raise InvalidName("; ".join(problems))

    def _new_queue(self, name: str, plan: Plan) -> Queue:
        return Queue(
            name=name,
            plan=plan,
            budget=self.budget,
            on_removed=self._removed,
            on_counted=self._counted,
        )

    def _new_topic(self, name: str, plan: Plan) -> Topic:
        topic = Topic(
            name=name,
            plan=plan,
            budget=self.budget,
            on_removed=self._removed,
            on_counted=self._counted,
        )
        self.topics[name] = topic
        return topic

    def prepare_drain(self, addresses: list[InboxAddress]) -> str:
        """Creates what a drain will move here and is missing (with the source's plans, and
        durable subscriptions), with one catalog commit, and returns the drain's token. What
        exists keeps its plan: the control plane may have ensured a newer one. Checks everything
        first: a bad name, plan or identity, or a name of the other kind, changes nothing."""
        for address in addresses:
            self._check_inbox(address)
        for address in addresses:
            if address.kind == "queue":
                if address.name not in self.queues:
                    self.ensure_queue(address.name, address.plan, commit=False)
                continue
            topic = self.topics.get(address.name) or self.ensure_topic(
                address.name, address.plan, commit=False
            )
            for identity in address.subscriptions:
                _, created = topic.subscribe(identity=identity, durable=True)
                if created:
                    self._catalog.add_subscription(address.name, identity)
        self.commit_catalog()
        return self.drain_tokens.issue()

    def _check_inbox(self, address: InboxAddress) -> None:
        self._check(address.name, address.plan)
        if address.kind == "queue":
            if address.name in self.topics:
                raise Conflict(f"{address.name!r} is a topic on this broker, not a queue")
            if address.subscriptions:
                raise InvalidName(f"queue {address.name!r} cannot have subscriptions")
        elif address.kind == "topic":
            if address.name in self.queues:
                raise Conflict(f"{address.name!r} is a queue on this broker, not a topic")
            for identity in address.subscriptions:
                problem = identity_problem(identity)
                if problem:
                    raise InvalidName(f"topic {address.name!r}: {problem}")
            found = self.topics.get(address.name)
            for identity in address.subscriptions:
                sub = found.subscriptions.get(identity) if found else None
                if sub is not None and not sub.durable:
                    raise Conflict(
                        f"subscription {identity!r} of {address.name!r} exists and is not durable"
                    )
        else:
            raise InvalidName(f"address kind must be queue or topic, not {address.kind!r}")

    # ------------------------------------------------------------------ lookups

    def find_queue(self, address: str) -> Queue | None:
        """A queue by name, or a subscription queue by `<topic>::<identity>`."""
        queue = self.queues.get(address)
        if queue is not None:
            return queue
        if address.startswith(DYNAMIC_PREFIX):
            return self.dynamic.get(address)
        if SUBSCRIPTION_SEPARATOR not in address:
            return None
        topic_name, identity = address.split(SUBSCRIPTION_SEPARATOR, 1)
        topic = self.topics.get(topic_name)
        sub = topic.subscriptions.get(identity) if topic else None
        return sub.queue if sub else None

    def subscribe(
        self,
        topic_name: str,
        *,
        identity: str,
        durable: bool,
        selector: Selector | None = None,
    ) -> Subscription:
        """The subscription, created or resumed. A durable one resumed with another selector
        is, as JMS says, a new subscription (what the old one held is gone), unless a consumer
        is still attached to it (Conflict). One without a selector takes the subscriber's (a
        subscription drained from another broker arrives without one; what it holds was
        selected there)."""
        topic = self.topics.get(topic_name)
        if topic is None:
            raise NotFound(f"no topic {topic_name!r} on this broker")
        text = selector.text if selector is not None else None
        found = topic.subscriptions.get(identity)
        if found is not None and found.selector_text != text:
            if found.queue.consumer_count:
                raise Conflict(
                    f"subscription {identity!r} of {topic_name!r} has consumers with the "
                    f"selector {found.selector_text!r}; it cannot change to {text!r} until "
                    "they detach"
                )
            if found.selector is None:
                found.selector = selector
                self._catalog.add_subscription(topic_name, identity, selector=text)
                self.commit_catalog()
                return found
            self.unsubscribe(topic_name, identity)
        sub, created = topic.subscribe(identity=identity, durable=durable, selector=selector)
        if created and durable:
            self._catalog.add_subscription(topic_name, identity, selector=text)
            self.commit_catalog()
        elif durable and identity in self._catalog.data.subscription_leases.get(topic_name, {}):
            self._catalog.lease_subscription(topic_name, identity, until_ms=None)  # it is back
            self.commit_catalog()
        return sub

    def lease_subscription(self, topic_name: str, identity: str, *, until_ms: int) -> None:
        """The last subscriber of a durable subscription went away asking for it to last only
        its terminus timeout: it is removed at `until_ms` unless one comes back meanwhile
        (`subscribe` ends the lease; `expire_subscriptions` removes). Kept in the catalog, so a
        restart changes neither the end nor the subscription."""
        self._catalog.lease_subscription(topic_name, identity, until_ms=until_ms)
        self.commit_catalog()

    def expire_subscriptions(self, now: int) -> list[tuple[str, str]]:
        """Removes, with what they held, the durable subscriptions whose lease ended by `now`
        (wall-clock ms) and that nobody consumes; returns their (topic, identity)."""
        expired = []
        for topic_name, leases in list(self._catalog.data.subscription_leases.items()):
            for identity, until in list(leases.items()):
                topic = self.topics.get(topic_name)
                sub = topic.subscriptions.get(identity) if topic is not None else None
                if until > now or (sub is not None and sub.queue.consumer_count):
                    continue
                if sub is not None:
                    self.unsubscribe(topic_name, identity)  # its lease goes with it
                else:
                    self._catalog.lease_subscription(topic_name, identity, until_ms=None)
                    self.commit_catalog()
                expired.append((topic_name, identity))
        return expired

    def unsubscribe(self, topic_name: str, identity: str) -> None:
        topic = self.topics.get(topic_name)
        sub = topic.unsubscribe(identity) if topic else None
        if sub is not None and sub.durable:
            self._catalog.drop_subscription(topic_name, identity)
            self.commit_catalog()

    # ------------------------------------------------------------------ messages

    def has_room(self, address: str) -> bool:
        target = self.queues.get(address) or self.topics.get(address)
        if target is None:
            target = self.find_queue(address)  # a drain's subscription queue, a dynamic one
        return target.has_room() if target is not None else False

    def when_room(self, callback: Callable[[], None]) -> None:
        """Calls `callback` once memory was freed (a producer waits for credit)."""
        self._room_waiters.append(callback)

    def publish(
        self,
        address: str,
        *,
        payload: bytes,
        durable: bool = False,
        ttl_ms: int | None = None,
        absolute_expiry_ms: int | None = None,
        on_owned: Callable[[], None] | None = None,
        now: int | None = None,
        delivery_count: int = 0,
        priority: int = DEFAULT_PRIORITY,
    ) -> bool:
        """Takes a message for a queue or topic. True: owned now. False: `on_owned` after fsync.

        `<topic>::<identity>` puts it straight into that subscription queue: only a drain's
        link gets there (the handler checks its token at attach). `delivery_count`: what the
        message had been through before (a drained one). Raises NotFound for an unknown address.
        """
        queue = self.queues.get(address)
        topic = None
        if queue is None:
            topic = self.topics.get(address)
            if topic is None:
                queue = self.find_queue(address)  # a subscription queue, a dynamic one
                if queue is None:
                    raise NotFound(f"no queue or topic {address!r} on this broker")
                plan = queue.plan
            else:
                plan = topic.plan
        else:
            plan = queue.plan
        expires_at = 0
        if ttl_ms or absolute_expiry_ms or plan.default_ttl_ms:
            now = now if now is not None else now_ms()
            expires_at = _deadline(now, ttl_ms, absolute_expiry_ms, plan.default_ttl_ms)
            if expires_at <= now:
                return True  # already dead: owned and dropped, never delivered
        msg_id = self._next_id
        self._next_id += 1
        # None unless scheduled or grouped (asks.py); most messages never make the call
        asks = None if payload[2:3] > PROPERTIES_CODE else asks_of(payload, now=now)
        if asks is not None:
            payload = asks.payload  # a delay is stored as the time it ends, journal included
        if queue is not None:
            journaled = durable and plan.persistent and self.journal is not None
            entry = Entry(msg_id, payload, journaled, expires_at, delivery_count)
            if asks is not None:
                self._admit(queue, entry, asks, priority)
            elif priority == DEFAULT_PRIORITY:
                queue.enqueue(entry)
            else:
                queue.enqueue_with_priority(entry, priority)
            self._dispatch(queue)
            if not journaled:
                return True  # the hot path: a message in memory is owned now
            journaled_to = [queue.name]
        else:
            assert topic is not None
            fanned = topic.fan_out(
                id=msg_id,
                payload=payload,
                durable=durable and self.journal is not None,
                expires_at=expires_at,
                priority=priority,
                admit=None if asks is None else lambda q, e: self._admit(q, e, asks, priority),
            )
            journaled_to = [q.name for q, e in fanned if e.journaled]
            for q, _ in fanned:
                self._dispatch(q)
            if not journaled_to:
                return True
        assert self.journal is not None
        self.journal.enqueue(
            msg_id=msg_id, queues=journaled_to, payload=payload, expires_at=expires_at
        )
        if delivery_count and queue is not None:
            self.journal.count(
                msg_id=msg_id, queue=journaled_to[0], delivery_count=delivery_count, failed=0
            )
        if on_owned is not None:
            self.journal.after_commit(on_owned)
        return False

    def _admit(self, queue: Queue, entry: Entry, asks: Asks, priority: int) -> None:
        """Enqueues a message that asked for a delivery time or a group (asks.py)."""
        if asks.deliver_at:
            if queue.schedule(entry, asks.deliver_at, priority=priority, group=asks.group):
                self.scheduler.wake(queue, asks.deliver_at)
        elif asks.group is not None:
            queue.enqueue_in_group(entry, group=asks.group, priority=priority)
        else:
            queue.enqueue_with_priority(entry, priority)

    def release_due(self, now: int | None = None) -> int:
        """Makes scheduled messages whose time has come ready and dispatches them; returns how
        many (the scheduler's timer calls this on the loop; domain tests call it by hand)."""
        now = now if now is not None else now_ms()
        released = 0
        for queue in self.scheduler.due(now):
            released += queue.release_due(now)
            following = queue.next_due()
            if following:
                self.scheduler.wake(queue, following)
            queue.dispatch(now)
        self.scheduler.rearm()
        return released

    def _dispatch(self, queue: Queue) -> None:
        if self.dispatch_later is not None:
            self.dispatch_later(queue)
        else:
            queue.dispatch(now_ms())

    def _removed(self, queue: Queue, entry: Entry, reason: Removal) -> None:
        if reason is DEAD_LETTERED:
            self._dead_lettered(queue, entry)
        else:
            if entry.journaled and self.journal is not None:
                self.journal.ack(msg_id=entry.id, queue=queue.name)
            if reason is EXPIRED and queue.plan.expiry_address:
                self._move(entry, from_queue=queue, to=queue.plan.expiry_address, why="expired")
        if self._room_waiters and self.budget.has_room():
            self._wake_room_waiters()

    def _dead_lettered(self, queue: Queue, entry: Entry) -> None:
        """To the dead-letter queue on this broker; held in its queue when there is none."""
        if self._dead_letter_queue(queue) is None:
            self._hold_dead(queue, entry)  # kept, and still journaled
            return
        if entry.journaled and self.journal is not None:
            self.journal.ack(msg_id=entry.id, queue=queue.name)
        self._move(entry, from_queue=queue, to=queue.plan.dead_letter_address, why="dead letter")

    def _dead_letter_queue(self, queue: Queue) -> Queue | None:
        """The queue on this broker that takes `queue`'s dead letters, or None."""
        name = queue.plan.dead_letter_address
        target = self.queues.get(name) if name else None
        return target if target is not queue else None

    def _hold_dead(self, queue: Queue, entry: Entry) -> None:
        first = not queue.dead_letters_held
        queue.hold_dead(entry)
        self._holding.add(queue)
        if entry.journaled and self.journal is not None:
            self.journal.count(
                msg_id=entry.id,
                queue=queue.name,
                delivery_count=entry.delivery_count,
                failed=DEAD_LETTER_HELD,
            )
        if first:
            log.warning(
                "dead letters held in their queue: no dead-letter queue on this broker",
                queue=queue.name,
                dead_letter_address=queue.plan.dead_letter_address or None,
            )

    def _rehome_dead_letters(self) -> None:
        """Moves held dead letters to their dead-letter queue where one now exists."""
        for queue in list(self._holding):
            if not queue.dead_letters_held or self.find_queue(queue.name) is not queue:
                self._holding.discard(queue)  # drained, or the queue was deleted
                continue
            if self._dead_letter_queue(queue) is None:
                continue
            released = queue.release_dead()
            self._holding.discard(queue)
            for entry in released:
                if entry.journaled and self.journal is not None:
                    self.journal.ack(msg_id=entry.id, queue=queue.name)
                self._move(
                    entry, from_queue=queue, to=queue.plan.dead_letter_address, why="dead letter"
                )
            log.info(
                "held dead letters moved",
                queue=queue.name,
                to=queue.plan.dead_letter_address,
                messages=len(released),
            )

    def _move(self, entry: Entry, *, from_queue: Queue, to: str, why: str) -> None:
        target = self.queues.get(to) if to else None
        if target is None or target is from_queue:
            log.warning("message dropped", queue=from_queue.name, reason=why, target=to or None)
            return
        moved = Entry(
            id=self._next_id,
            payload=entry.payload,
            journaled=entry.journaled and target.plan.persistent,
            delivery_count=entry.delivery_count,
        )
        self._next_id += 1
        target.enqueue_with_priority(moved, priority_of(entry))
        target.dispatch(now_ms())
        if moved.journaled and self.journal is not None:
            self.journal.enqueue(
                msg_id=moved.id, queues=[target.name], payload=moved.payload, expires_at=0
            )
            if moved.delivery_count:
                self._counted(target, moved)

    def _counted(self, queue: Queue, entry: Entry) -> None:
        """A journaled entry's delivery count changed: journal it (same group commit)."""
        if self.journal is not None:
            self.journal.count(
                msg_id=entry.id,
                queue=queue.name,
                delivery_count=entry.delivery_count,
                failed=entry.failed_attempts,
            )

    def _wake_room_waiters(self) -> None:
        waiters, self._room_waiters = self._room_waiters, []
        for waiter in waiters:
            waiter()

    def wake_if_room(self) -> None:
        if self._room_waiters:
            self._wake_room_waiters()

    def reap(self, now: int | None = None) -> int:
        """Expires every overdue ready message of every queue, without waiting for consumers."""
        now = now if now is not None else now_ms()
        reaped = 0
        for queue in self.all_queues():
            reaped += queue.reap(now)
        if reaped:
            for queue in self.all_queues():
                queue.dispatch(now)  # expiry addresses may have consumers waiting
        return reaped

    def all_queues(self) -> list[Queue]:
        found = list(self.queues.values())
        found.extend(self.dynamic.values())
        for topic in self.topics.values():
            found.extend(sub.queue for sub in topic.subscriptions.values())
        return found

    def commit(self) -> None:
        """Group commit: one fsync for every journal record since the last one, then settle."""
        if self.journal is not None and self.journal.pending:
            self.journal.commit()


DYNAMIC_PLAN = Plan(persistent=False)
"""A temporary queue's plan: nothing journaled; its messages go with it."""


def _recovered_selector(data: CatalogData, *, topic: str, identity: str) -> Selector | None:
    text = data.subscription_selectors.get(topic, {}).get(identity)
    if text is None:
        return None
    try:
        return compile_selector(text)
    except SelectorError as error:  # it compiled when it was stored: a newer, stricter parser
        log.error("stored selector refused", topic=topic, subscription=identity, error=str(error))
        return None


def _deadline(now: int, ttl_ms: int | None, absolute_ms: int | None, default_ttl_ms: int) -> int:
    """The wall-clock ms at which a message expires (0 = never): the earliest of what applies."""
    candidates = []
    if ttl_ms:
        candidates.append(now + ttl_ms)
    elif default_ttl_ms:
        candidates.append(now + default_ttl_ms)
    if absolute_ms:
        candidates.append(absolute_ms)
    return min(candidates) if candidates else 0


def _recovered_priority(payload: bytes) -> int:
    """The priority a journaled message was sent with (its header is in the stored bytes)."""
    try:
        return message_facts(payload)[3]
    except (codec.CodecError, IndexError, ValueError):
        return DEFAULT_PRIORITY  # it was read on arrival, so this does not happen
