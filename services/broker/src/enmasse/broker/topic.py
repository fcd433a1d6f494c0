"""A topic: every subscriber gets every message published after it subscribed, through a
subscription queue of its own (so each subscriber has the queue's redelivery, TTL and DLQ rules).

What flows in: subscribe/unsubscribe (from receiver links on the topic address) and published
messages. What flows out: one entry per subscription queue, sharing the id and the payload bytes.

Subscription identity follows AMQP 1.0 / the JMS mapping: a durable subscription (receiver source
`durable` + `expiry-policy never`) is named `container-id|link-name`, or just the link name when the
link carries the `shared` capability (several connections share one subscription). A non-durable
subscription is private to its link and named after it; it vanishes when the link closes. The
subscription queue's address is `<topic>::<identity>`, which keeps it apart from every queue name
(the admin refuses `::` in names).

A subscription may have a selector (the subscriber's JMS selector, `enmasse.amqp.selector`):
its queue then receives only the messages it selects, evaluated once per message at publish;
a subscription without one costs the fan-out nothing more than a None check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from enmasse.amqp.selector import Selector
from enmasse.broker.entry import DEFAULT_PRIORITY, Entry
from enmasse.broker.plan import Plan
from enmasse.broker.queue import CountedHook, MemoryBudget, Queue, RemovedHook
from enmasse.resources.contracts import SUBSCRIPTION_SEPARATOR


def durable_identity(*, container_id: str, link_name: str, shared: bool) -> str:
    """The name a durable subscription is known by across detach, reconnect and restart."""
    if shared:
        # JMS clients suffix shared subscription link names with `|global` or `|volatileN`.
        return link_name.split("|", 1)[0]
    return f"{container_id}|{link_name}"


@dataclass(slots=True)
class Subscription:
    identity: str
    durable: bool
    queue: Queue
    selector: Selector | None = None

    @property
    def selector_text(self) -> str | None:
        return self.selector.text if self.selector is not None else None


class Topic:
    def __init__(
        self,
        *,
        name: str,
        plan: Plan,
        budget: MemoryBudget | None = None,
        on_removed: RemovedHook | None = None,
        on_counted: CountedHook | None = None,
    ) -> None:
        self.name = name
        self.plan = plan
        self._budget = budget or MemoryBudget()
        self._on_removed = on_removed
        self._on_counted = on_counted
        self.subscriptions: dict[str, Subscription] = {}
        self.published = 0

    def queue_name(self, identity: str) -> str:
        return f"{self.name}{SUBSCRIPTION_SEPARATOR}{identity}"

    def subscribe(
        self, *, identity: str, durable: bool, selector: Selector | None = None
    ) -> tuple[Subscription, bool]:
        """Returns the subscription, and whether it was created now (False: resumed, with the
        selector it has: changing it is the broker's decision, see `Broker.subscribe`)."""
        found = self.subscriptions.get(identity)
        if found is not None:
            return found, False
        queue = Queue(
            name=self.queue_name(identity),
            plan=self.plan,
            budget=self._budget,
            on_removed=self._on_removed,
            on_counted=self._on_counted,
        )
        created = Subscription(identity=identity, durable=durable, queue=queue, selector=selector)
        self.subscriptions[identity] = created
        return created, True

    def unsubscribe(self, identity: str) -> Subscription | None:
        """Deletes the subscription and what it held; the caller acks the journaled entries."""
        gone = self.subscriptions.pop(identity, None)
        if gone is not None:
            gone.queue.purge()
        return gone

    def fan_out(
        self,
        *,
        id: int,
        payload: bytes,
        durable: bool,
        expires_at: int,
        priority: int = DEFAULT_PRIORITY,
        admit: Callable[[Queue, Entry], None] | None = None,
    ) -> list[tuple[Queue, Entry]]:
        """One entry per subscription (journaled only where the subscription is durable).
        `admit` enqueues instead, for a message that asked for a delivery time or a group."""
        self.published += 1
        entries: list[tuple[Queue, Entry]] = []
        persistent = durable and self.plan.persistent
        for sub in self.subscriptions.values():
            selector = sub.selector
            if selector is not None and not selector.matches(payload):
                continue
            entry = Entry(
                id=id,
                payload=payload,
                journaled=persistent and sub.durable,
                expires_at=expires_at,
            )
            if admit is not None:
                admit(sub.queue, entry)
            elif priority == DEFAULT_PRIORITY:
                sub.queue.enqueue(entry)
            else:
                sub.queue.enqueue_with_priority(entry, priority)
            entries.append((sub.queue, entry))
        return entries

    def has_room(self) -> bool:
        """A topic takes more only while every subscription queue has room (slowest subscriber)."""
        if not self._budget.has_room():
            return False
        return all(sub.queue.has_room() for sub in self.subscriptions.values())

    @property
    def depth(self) -> int:
        return sum(sub.queue.depth for sub in self.subscriptions.values())
