"""A queue: messages in, each handed to exactly one of its consumers, FIFO, fairly.

What flows in: entries from producers (`enqueue`), consumers' credit (`dispatch` asks each consumer
how much it has), consumers' outcomes (`settle`), the clock (`reap`). What flows out: entries to
consumers (`Consumer.deliver`) and every entry that leaves, with the reason, to `on_removed` (the
broker journals the acknowledgement, moves dead letters and expired messages, counts).

Why it is built so:
- Ready entries sit in a deque in arrival order; entries that come back (released, modified) go to
  a heap keyed by id and are served first, so a redelivered message keeps its place in FIFO order.
- Consumers are served round robin, one message each, skipping those without credit: fair
  competing consumers without per-consumer queues.
- Expiry uses a heap of deadlines and lazy removal (an expired entry is marked GONE and skipped
  when popped), so reaping and TTL checks are O(log n) and never scan the queue.
- Browsers (AMQP `copy` distribution mode) see every ready entry once, in id order, and take
  nothing.
- The queue never refuses a message: the memory limit is enforced upstream by withholding credit
  (`has_room`), so a producer waits and nothing is dropped.
- The delivery-count a consumer sees counts deliveries that may have been processed (AMQP 1.0
  §3.4): a release or a plain modified gives the entry back unchanged (§3.4.4); modified with
  delivery-failed adds one and is a failed attempt, the only kind that counts towards the plan's
  max delivery attempts and the dead-letter address (§3.4.5); a consumer that goes away holding
  it adds one (it may have processed it) without a failed attempt. An entry whose count changed
  is reported to `on_counted`, so the broker can journal the new count of a durable one; an
  entry consumed at the first attempt, or only ever released, never is.
- An entry settled modified with undeliverable-here remembers who refused it (`refused_by`) and
  waits in a list of its own, `_held_back`; dispatch offers it only to another consumer with
  credit (a new one, when no other is attached), so the list is looked at once per dispatch
  call while non-empty, never per message, and ordinary entries never carry the refusal.
- While a drain owns the queue (`hand_off` set), `dispatch` hands the queue to the drain instead
  of to consumers: they get nothing new, and what they give back moves with the rest.
- A dead letter the broker has nowhere to put (no dead-letter queue on this broker) is held
  here (`hold_dead`): out of every dispatch structure, so it is never delivered again and costs
  dispatch nothing, but counted in `bytes` and reported (`dead_letters_held`) until the broker
  takes it out (`release_dead`) for its dead-letter queue, a drain moves it, or the queue is
  deleted.
- A consumer with a selector (JMS, `enmasse.amqp.selector`) takes only the entries it selects,
  in order; the others stay where they are for the other consumers. A queue without one
  dispatches exactly as above (`_selections` empty: the same loop). With one, dispatch goes
  through `_dispatch_selective`: each selective consumer keeps the entries it has not looked at
  yet (`Selection.waiting`, collected from the tail of the ready deque by id, since ids there
  only grow) and looks at each entry once: one it does not select is dropped from its list
  and never evaluated for it again, so a backlog nobody selects costs nothing per dispatch.
  An entry it takes leaves a stale reference behind in the ready deque (skipped like any entry
  that is no longer READY; the deque is rebuilt once stale references are half of it), and so
  an entry that comes back to such a queue comes back as a fresh Entry (`_fresh`): every stale
  reference to the old object sees it GONE, so nothing is delivered twice. Browsers with a
  selector see only what it selects.
- Priority (AMQP header, 0-9, higher first, FIFO within a level): while every message has the
  default priority (4), nothing above changes and nothing is paid for it. The first message with
  another priority (`enqueue_with_priority`) makes the queue prioritized for good: one deque per
  level (`_levels`, the ready deque is level 4's), and dispatch goes through the general loop
  (`_dispatch_selective`) with `_pop_prioritized`, which takes from the highest level that has
  an entry. Redeliveries keep their place inside their level: the `_returned` heap's key is the
  id shifted by the level (`_return_key`), equal to the id at level 4. A selective consumer of a
  prioritized queue scans the levels top down for the first entry it selects (its one-look
  bookkeeping is for the single-level case). Browsers still see entries in id order.
- Scheduled entries (`schedule`, schedule.py) are SCHEDULED in a heap of their own, out of every
  dispatch structure and of `depth` (in `bytes`, in the expiry heap) until `release_due` makes
  them ready at their level; selective consumers are handed them (`_make_ready`), since their
  id may be older than what arrived meanwhile.
- Message groups (groups.py): the first entry with a group-id (`enqueue_in_group`) makes the
  queue grouped for good, and dispatch goes through `_dispatch_grouped`: each consumer first
  takes what is parked for it (its groups' entries, in key order), then the next entry of the
  ready stream it may have; an entry of another consumer's group met there is parked with that
  owner, one coming back (released, modified) is parked with it directly, and a consumer that
  goes away gives its groups up and its parked entries back to `_returned`. A queue that never
  saw a group-id pays one None check per dispatch call.
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from enmasse.amqp.selector import Selector
from enmasse.broker.entry import (
    ACKED,
    DEAD_LETTERED,
    DEFAULT_PRIORITY,
    DELETED,
    DRAINED,
    EXPIRED,
    GONE,
    IN_FLIGHT,
    READY,
    SCHEDULED,
    TOP_PRIORITY,
    Entry,
    Removal,
    priority_level,
    priority_of,
)
from enmasse.broker.groups import Groups
from enmasse.broker.plan import Plan
from enmasse.broker.schedule import Scheduled


class Consumer(Protocol):
    """What a queue needs from a consumer: how many more it may take, and how to hand one over."""

    def credit(self) -> int: ...

    def deliver(self, entry: Entry) -> None: ...


class Settlement(enum.Enum):
    """A consumer's outcome, in the broker's terms (the handler maps AMQP outcomes onto these)."""

    ACCEPTED = "accepted"
    RELEASED = "released"  # not processed: redeliver unchanged, delivery-count as it was
    MODIFIED = "modified"  # modified without delivery-failed: like released
    FAILED = "failed"  # modified(delivery-failed): delivery-count + 1, a failed attempt
    REJECTED = "rejected"  # poison: straight to the dead-letter address


# Module names for the members, as in entry.py (enum member lookups are dear in Python 3.11).
ACCEPTED, RELEASED, MODIFIED = Settlement.ACCEPTED, Settlement.RELEASED, Settlement.MODIFIED
FAILED, REJECTED = Settlement.FAILED, Settlement.REJECTED


class MemoryBudget:
    """Bytes held by all queues of the broker against one ceiling: it never dies of memory."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit  # 0: unbounded
        self.used = 0

    def has_room(self) -> bool:
        return not self.limit or self.used < self.limit


@dataclass(eq=False)
class Selection:
    """A consumer's selector, and the entries it has not looked at yet (oldest first)."""

    selector: Selector
    waiting: deque[Entry] = field(default_factory=deque)
    seen_id: int = 0  # every ready entry up to this id is in `waiting` or was looked at
    passed_over: set[Entry] = field(default_factory=set)  # redelivered entries it does not select


STALE_SLACK = 64  # stale references a deque may hold before it is worth rebuilding
LEVEL_SHIFT = 1 << 64  # `_return_key`: ids stay far below this

RemovedHook = Callable[["Queue", Entry, Removal], None]
CountedHook = Callable[["Queue", Entry], None]


class Queue:
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
        self.budget = budget or MemoryBudget()
        self.on_removed: RemovedHook = on_removed or _ignore
        self.on_counted = on_counted
        self.hand_off: Callable[[Queue], None] | None = None  # a drain owns the queue
        self._ready: deque[Entry] = deque()
        self._returned: list[tuple[int, Entry]] = []  # heap by id: redeliveries first
        self._expiring: list[tuple[int, int, Entry]] = []  # heap by deadline
        self._consumers: list[Consumer] = []
        self._browsers: dict[Consumer, int] = {}  # browser -> last id it saw
        self._in_flight: dict[Consumer, set[Entry]] = {}
        self._held_back: list[tuple[int, Entry]] = []  # heap by id: refused by some consumers
        self._selections: dict[Consumer, Selection] = {}  # consumers with a selector
        self._browsing: dict[Consumer, Selector] = {}  # browsers with a selector
        self._returns_fresh = False  # set for good once a consumer had a selector: see `_fresh`
        self._stale = 0  # entries taken out of the ready deque's middle since it was rebuilt
        self._levels: list[deque[Entry]] | None = None  # per priority; None: all default
        self._groups: Groups[Consumer] | None = None  # from the first group-id: groups.py
        self._scheduled: Scheduled | None = None  # entries not visible yet: schedule.py
        self._rr = 0
        self.depth = 0  # READY entries
        self.bytes = 0  # READY + IN_FLIGHT payload bytes
        self.last_id = 0
        self.enqueued = 0
        self.dequeued = 0
        self.expired = 0
        self.dead_lettered = 0
        self._dead_held: list[Entry] = []  # dead letters with nowhere to go, oldest first

    # ------------------------------------------------------------------ producers

    def has_room(self) -> bool:
        """Whether producers may get more credit (per-plan limit and the broker-wide budget)."""
        limit = self.plan.memory_limit_bytes
        return (not limit or self.bytes < limit) and self.budget.has_room()

    def enqueue(self, entry: Entry) -> None:
        entry.state = READY
        self._ready.append(entry)
        size = len(entry.payload)
        self.depth += 1
        self.bytes += size
        self.budget.used += size
        if entry.expires_at:
            heapq.heappush(self._expiring, (entry.expires_at, entry.id, entry))
        self.enqueued += 1
        if entry.id > self.last_id:
            self.last_id = entry.id

    def enqueue_with_priority(self, entry: Entry, priority: int) -> None:
        """`enqueue` for a message whose header gave a priority; only another priority than
        the default costs anything (the queue keeps one deque per level from then on)."""
        level = priority_level(priority)
        if level == DEFAULT_PRIORITY:
            self.enqueue(entry)
            return
        entry.priority = level
        levels = self._levels if self._levels is not None else self._prioritize()
        self.enqueue(entry)
        self._ready.pop()  # `enqueue` put it at level 4's tail: it belongs to its own level
        levels[level].append(entry)

    def _prioritize(self) -> list[deque[Entry]]:
        """Turns this queue into a prioritized one, for good (see the module docstring)."""
        levels: list[deque[Entry]] = [deque() for _ in range(TOP_PRIORITY + 1)]
        levels[DEFAULT_PRIORITY] = self._ready
        self._levels = levels
        for selection in self._selections.values():
            selection.waiting.clear()  # selective consumers scan the levels from now on
        return levels

    def enqueue_in_group(self, entry: Entry, *, group: str, priority: int) -> None:
        """`enqueue_with_priority` for a message with a group-id: the first one makes the
        queue grouped for good (`_dispatch_grouped`), as the first priority makes it
        prioritized; a queue that never sees one never pays for groups."""
        entry.group = group
        if self._groups is None:
            self._groups = Groups[Consumer]()
        self.enqueue_with_priority(entry, priority)

    def schedule(
        self, entry: Entry, deliver_at: int, *, priority: int, group: str | None = None
    ) -> bool:
        """Stores an entry no consumer (nor browser, nor `depth`) sees before `deliver_at`
        (ms since the epoch); it counts in `bytes` and expires at its deadline all the same.
        True when it is now this queue's earliest: the broker's scheduler must know."""
        entry.state = SCHEDULED
        entry.deliver_at = deliver_at
        if priority_level(priority) != DEFAULT_PRIORITY:
            entry.priority = priority_level(priority)
            if self._levels is None:
                self._prioritize()
        if group is not None:
            entry.group = group
            if self._groups is None:
                self._groups = Groups[Consumer]()
        size = len(entry.payload)
        self.bytes += size
        self.budget.used += size
        if entry.expires_at:
            heapq.heappush(self._expiring, (entry.expires_at, entry.id, entry))
        self.enqueued += 1
        if self._scheduled is None:
            self._scheduled = Scheduled()
        return self._scheduled.push(entry, deliver_at)

    def release_due(self, now_ms: int) -> int:
        """Makes every scheduled entry whose time has come ready (at its priority level, after
        what is ready already); returns how many. The caller dispatches."""
        if self._scheduled is None:
            return 0
        released = 0
        for entry in self._scheduled.due(now_ms):
            if entry.expired(now_ms):
                self._remove(entry, EXPIRED)
                continue
            self._make_ready(entry)
            released += 1
        return released

    def next_due(self) -> int:
        """The earliest due time of a scheduled entry (0: none)."""
        return self._scheduled.next_due() if self._scheduled is not None else 0

    @property
    def scheduled(self) -> int:
        """Entries stored but not visible yet."""
        return len(self._scheduled) if self._scheduled is not None else 0

    def _make_ready(self, entry: Entry) -> None:
        """A scheduled entry joins the ready entries. Its id may be older than entries that
        arrived meanwhile, so selective consumers get it handed, not found by id (`_collect`)."""
        for selection in self._selections.values():
            if self.last_id > selection.seen_id:
                self._collect(selection)
        entry.state = READY
        self.depth += 1
        if self._levels is None:
            self._ready.append(entry)
        else:
            self._levels[priority_of(entry)].append(entry)
        if entry.id > self.last_id:
            self.last_id = entry.id
        if self._levels is None:  # a prioritized queue's selective consumers scan the levels
            for selection in self._selections.values():
                selection.waiting.append(entry)
                selection.seen_id = self.last_id

    def _count_out(self, entry: Entry) -> None:
        size = len(entry.payload)
        self.bytes -= size
        self.budget.used -= size

    # ------------------------------------------------------------------ consumers

    @property
    def consumer_count(self) -> int:
        return len(self._consumers) + len(self._browsers)

    def add_consumer(
        self, consumer: Consumer, *, browse: bool = False, selector: Selector | None = None
    ) -> None:
        """A consumer (or a browser); with a selector it sees only the entries that select."""
        if browse:
            self._browsers[consumer] = 0
            if selector is not None:
                self._browsing[consumer] = selector
            return
        self._consumers.append(consumer)
        self._in_flight[consumer] = set()
        if selector is not None:
            ready = self._ready if self._levels is None else ()
            waiting = deque(entry for entry in ready if entry.state is READY)
            self._selections[consumer] = Selection(selector, waiting, seen_id=self.last_id)
            self._returns_fresh = True

    def remove_consumer(self, consumer: Consumer) -> None:
        """The consumer went away: what it held unsettled comes back (released, not failed)."""
        if self._browsers.pop(consumer, None) is not None:
            self._browsing.pop(consumer, None)
            return
        if consumer not in self._in_flight:
            return
        self._consumers.remove(consumer)
        self._selections.pop(consumer, None)
        for _, held in self._held_back:
            held.refused_by.discard(consumer)  # it will never ask again: do not keep it alive
        if self._groups is not None:  # its groups are free; what waited for it comes back first
            for item in self._groups.release(consumer):
                heapq.heappush(self._returned, item)
        for entry in sorted(self._in_flight.pop(consumer), key=_by_id):
            self._return(entry, count=True)

    @property
    def in_flight(self) -> int:
        """Entries sent to consumers and not settled yet."""
        return sum(len(held) for held in self._in_flight.values())

    def dispatch(self, now_ms: int) -> int:
        """Hands ready entries to consumers with credit, round robin; returns how many were sent."""
        if self.hand_off is not None:
            self.hand_off(self)  # draining: the ready entries are the drain's, not consumers'
            return 0
        sent = 0
        consumers = self._consumers
        if self._held_back and consumers:
            sent = self._place_held_back(consumers)
        if consumers and self.depth:
            if self._groups is not None:
                sent = self._dispatch_grouped(consumers, now_ms)
            elif self._selections or self._levels is not None:
                sent = self._dispatch_selective(consumers, now_ms)
            else:
                sent = self._dispatch_round_robin(consumers, now_ms)
        if self._browsers:
            self._dispatch_browsers(now_ms)
        return sent

    def _dispatch_round_robin(self, consumers: list[Consumer], now_ms: int) -> int:
        n = len(consumers)
        # Credit is read once per consumer per call and counted down here: every delivery
        # takes exactly one credit, and asking the link each time costs more than the rest.
        credits = [c.credit() for c in consumers]
        in_flight = self._in_flight
        i = self._rr % n
        idle = 0
        sent = 0
        while self.depth and idle < n:
            if credits[i] <= 0:
                idle += 1
                i = (i + 1) % n
                continue
            entry = self._pop_ready(now_ms)
            if entry is None:
                break
            idle = 0
            credits[i] -= 1
            consumer = consumers[i]
            entry.state = IN_FLIGHT
            in_flight[consumer].add(entry)
            consumer.deliver(entry)
            sent += 1
            i = (i + 1) % n
        self._rr = i
        return sent

    def _dispatch_selective(self, consumers: list[Consumer], now_ms: int) -> int:
        """`_dispatch_round_robin` for a queue where some consumers have a selector: each
        consumer in turn takes the next entry it may have; one that finds none sits out."""
        n = len(consumers)
        credits = [c.credit() for c in consumers]
        selections = self._selections
        in_flight = self._in_flight
        pop = self._pop_ready if self._levels is None else self._pop_prioritized
        i = self._rr % n
        idle = 0
        sent = 0
        while self.depth and idle < n:
            if credits[i] <= 0:
                idle += 1
                i = (i + 1) % n
                continue
            consumer = consumers[i]
            selection = selections.get(consumer)
            entry = pop(now_ms) if selection is None else self._pop_selected(selection, now_ms)
            if entry is None:
                credits[i] = 0  # nothing for it now
                idle += 1
                i = (i + 1) % n
                continue
            idle = 0
            credits[i] -= 1
            entry.state = IN_FLIGHT
            in_flight[consumer].add(entry)
            consumer.deliver(entry)
            sent += 1
            i = (i + 1) % n
        self._rr = i
        return sent

    def _dispatch_grouped(self, consumers: list[Consumer], now_ms: int) -> int:
        """`_dispatch_selective` for a queue that has seen a group-id: each consumer in turn
        takes what is parked for it (its groups' entries, oldest first), else the next entry of
        the ready stream it may have (`_pop_for_group`); one that finds none sits out."""
        groups = self._groups
        assert groups is not None
        n = len(consumers)
        credits = [c.credit() for c in consumers]
        in_flight = self._in_flight
        i = self._rr % n
        idle = 0
        sent = 0
        while self.depth and idle < n:
            if credits[i] <= 0:
                idle += 1
                i = (i + 1) % n
                continue
            consumer = consumers[i]
            entry = groups.next_parked(consumer)
            if entry is not None:
                self.depth -= 1
                if entry.expired(now_ms):
                    self._remove(entry, EXPIRED)
                    continue
            else:
                entry = self._pop_for_group(groups, consumer, now_ms)
            if entry is None:
                credits[i] = 0  # nothing for it now
                idle += 1
                i = (i + 1) % n
                continue
            idle = 0
            credits[i] -= 1
            entry.state = IN_FLIGHT
            in_flight[consumer].add(entry)
            consumer.deliver(entry)
            sent += 1
            i = (i + 1) % n
        self._rr = i
        return sent

    def _pop_for_group(
        self, groups: Groups[Consumer], consumer: Consumer, now_ms: int
    ) -> Entry | None:
        """The next ready entry `consumer` may have: ungrouped, of a group it owns, or of a free
        group (it takes the group). An entry of another consumer's group met on the way is
        parked with that owner, unless the owner's selector does not select it (then a group
        cannot keep it, and it goes to whoever selects it)."""
        selection = self._selections.get(consumer)
        pop = self._pop_ready if self._levels is None else self._pop_prioritized
        while True:
            entry = pop(now_ms) if selection is None else self._pop_selected(selection, now_ms)
            if entry is None:
                return None
            group = getattr(entry, "group", None)
            if group is None:
                return entry
            owner = groups.owner_of(group)
            if owner is None:
                groups.assign(group, consumer)
                return entry
            if owner is consumer or not self._selects(owner, entry):
                return entry
            if self._returns_fresh:
                entry = _fresh(entry)  # stale references elsewhere see the old one GONE
            entry.state = READY
            self.depth += 1
            groups.park(owner, self._key(entry), entry)

    def _parked_with_owner(self, key: int, entry: Entry) -> bool:
        """A grouped entry coming back waits for its group's owner, in order (True), unless
        its group has none now."""
        group = getattr(entry, "group", None)
        groups = self._groups
        owner = groups.owner_of(group) if groups is not None and group is not None else None
        if owner is None:
            return False
        assert groups is not None
        groups.park(owner, key, entry)
        return True

    def _key(self, entry: Entry) -> int:
        """An entry's place among ready ones: its id, shifted by its level when prioritized."""
        return entry.id if self._levels is None else _return_key(entry)

    def _pop_selected(self, selection: Selection, now_ms: int) -> Entry | None:
        """The oldest ready entry the selection selects (redeliveries first), taken out of
        the queue (depth counted down); None when it selects none of them."""
        if self._levels is not None:
            return self._pop_selected_prioritized(selection, now_ms)
        if self._returned:
            entry = self._take_returned(selection, now_ms)
            if entry is not None:
                return entry
        if self.last_id > selection.seen_id:
            self._collect(selection)
        waiting = selection.waiting
        matches = selection.selector.matches
        while waiting:
            entry = waiting.popleft()
            if entry.state is not READY:
                continue  # taken by another consumer, expired, or came back as a fresh entry
            if entry.expired(now_ms):
                self.depth -= 1
                self._remove(entry, EXPIRED)
                continue
            if matches(entry.payload):
                self.depth -= 1
                self._left_stale()  # its reference stays in the ready deque
                return entry
        return None

    def _take_returned(self, selection: Selection, now_ms: int) -> Entry | None:
        """The oldest redelivered entry the selection selects. Redeliveries are few: they are
        looked at in id order each time, except those this selection already passed over."""
        live = [item for item in self._returned if item[1].state is READY]
        if len(live) != len(self._returned):
            heapq.heapify(live)
            self._returned = live
            selection.passed_over.intersection_update(entry for _, entry in live)
        passed_over = selection.passed_over
        for _, entry in sorted(live, key=_by_key):
            if entry in passed_over:
                continue
            if entry.expired(now_ms):
                self.depth -= 1
                self._remove(entry, EXPIRED)
                continue
            if selection.selector.matches(entry.payload):
                self.depth -= 1
                return entry  # its heap item is skipped from now on: no longer READY
            passed_over.add(entry)
        return None

    def _collect(self, selection: Selection) -> None:
        """Adds the entries that arrived since the selection last looked (the ready deque's
        tail, newest first until an id it has seen) to what it has to look at."""
        arrived: list[Entry] = []
        seen = selection.seen_id
        for entry in reversed(self._ready):
            if entry.id <= seen:
                break
            arrived.append(entry)
        arrived.reverse()
        waiting = selection.waiting
        waiting.extend(arrived)
        selection.seen_id = self.last_id
        if len(waiting) > 2 * self.depth + STALE_SLACK:
            selection.waiting = deque(entry for entry in waiting if entry.state is READY)

    def _left_stale(self) -> None:
        """An entry was taken from the middle of the ready deque: rebuild the deque once such
        stale references are half of it (each rebuild is paid for by that many takes)."""
        self._stale += 1
        if self._stale > STALE_SLACK and 2 * self._stale > len(self._ready):
            self._ready = deque(entry for entry in self._ready if entry.state is READY)
            self._stale = 0
            if self._levels is not None:
                self._levels[DEFAULT_PRIORITY] = self._ready

    def _selects(self, consumer: Consumer, entry: Entry) -> bool:
        selection = self._selections.get(consumer)
        return selection is None or selection.selector.matches(entry.payload)

    def _place_held_back(self, consumers: list[Consumer]) -> int:
        """Offers each refused entry, oldest first, to a consumer that did not refuse it."""
        waiting: list[tuple[int, Entry]] = []
        sent = 0
        credits = {c: c.credit() for c in consumers}
        for key, entry in sorted(self._held_back, key=_by_key):
            if entry.state is not READY:
                continue  # expired, drained or deleted meanwhile
            taker = next(
                (
                    c
                    for c in consumers
                    if credits[c] > 0 and c not in entry.refused_by and self._selects(c, entry)
                ),
                None,
            )
            if taker is None:
                waiting.append((key, entry))
                continue
            credits[taker] -= 1
            self.depth -= 1
            entry.state = IN_FLIGHT
            self._in_flight[taker].add(entry)
            taker.deliver(entry)
            sent += 1
        self._held_back = waiting
        return sent

    def _pop_ready(self, now_ms: int) -> Entry | None:
        while self._returned or self._ready:
            entry = heapq.heappop(self._returned)[1] if self._returned else self._ready.popleft()
            if entry.state is not READY:
                continue  # reaped or deleted while waiting: lazy removal
            self.depth -= 1
            if entry.expired(now_ms):
                self._remove(entry, EXPIRED)
                continue
            return entry
        return None

    def _pop_prioritized(self, now_ms: int) -> Entry | None:
        """`_pop_ready` for a prioritized queue: the highest level first, a redelivery before
        the ready entries of its own level."""
        levels = self._levels
        assert levels is not None
        returned = self._returned
        while True:
            level = next((p for p in range(TOP_PRIORITY, -1, -1) if levels[p]), -1)
            if returned and priority_of(returned[0][1]) >= level:
                entry = heapq.heappop(returned)[1]
            elif level >= 0:
                entry = levels[level].popleft()
            else:
                return None
            if entry.state is not READY:
                continue
            self.depth -= 1
            if entry.expired(now_ms):
                self._remove(entry, EXPIRED)
                continue
            return entry

    def _pop_selected_prioritized(self, selection: Selection, now_ms: int) -> Entry | None:
        """`_pop_selected` for a prioritized queue: the first entry it selects, level by level
        from the top, redeliveries first within a level."""
        levels = self._levels
        assert levels is not None
        returned = sorted(self._returned, key=_by_key)  # level, then id: see `_return_key`
        matches = selection.selector.matches
        r = 0
        for level in range(TOP_PRIORITY, -1, -1):
            while r < len(returned) and priority_of(returned[r][1]) >= level:
                entry = returned[r][1]
                r += 1
                if self._takes(entry, matches, now_ms):
                    return entry  # its heap item is skipped from now on: no longer READY
            ready = levels[level]
            for index, entry in enumerate(ready):
                if self._takes(entry, matches, now_ms):
                    del ready[index]
                    return entry
        return None

    def _takes(self, entry: Entry, matches: Callable[[bytes], bool], now_ms: int) -> bool:
        """Whether a selective consumer takes this entry (depth counted down if so); an
        expired one met on the way is removed."""
        if entry.state is not READY:
            return False
        if entry.expired(now_ms):
            self.depth -= 1
            self._remove(entry, EXPIRED)
            return False
        if matches(entry.payload):
            self.depth -= 1
            return True
        return False

    def _dispatch_browsers(self, now_ms: int) -> None:
        for browser, seen in list(self._browsers.items()):
            if browser.credit() <= 0 or seen >= self.last_id:
                continue
            selector = self._browsing.get(browser)
            entries = self.snapshot()
            if self._levels is not None:
                entries.sort(key=_by_id)  # browsers see entries in id order: `seen` is an id
            for entry in entries:
                if entry.id <= seen or entry.expired(now_ms):
                    continue
                if browser.credit() <= 0:
                    break
                if selector is None or selector.matches(entry.payload):
                    browser.deliver(entry)
                self._browsers[browser] = entry.id

    def snapshot(self) -> list[Entry]:
        """The ready entries in delivery order (redeliveries first, then FIFO)."""
        returned_items = self._returned
        if self._groups is not None:  # parked for their group's owner: ready all the same
            returned_items = [*returned_items, *self._groups.parked()]
        returned = [e for _, e in sorted(returned_items, key=_by_key)]
        held = [e for _, e in sorted(self._held_back, key=_by_key)]
        if self._levels is None:
            return [e for e in (*held, *returned, *self._ready) if e.state is READY]
        ordered = held
        r = 0
        for level in range(TOP_PRIORITY, -1, -1):
            while r < len(returned) and priority_of(returned[r]) >= level:
                ordered.append(returned[r])
                r += 1
            ordered.extend(self._levels[level])
        return [e for e in ordered if e.state is READY]

    # ------------------------------------------------------------------ outcomes

    def settle(self, consumer: Consumer, entry: Entry, settlement: Settlement) -> None:
        try:
            self._in_flight[consumer].remove(entry)
        except KeyError:
            return  # settled twice, or after the consumer left (already returned)
        if settlement is ACCEPTED:
            # The hot path, inlined: one acknowledgement per message consumed.
            self.dequeued += 1
            entry.state = GONE
            size = len(entry.payload)
            self.bytes -= size
            self.budget.used -= size
            self.on_removed(self, entry, ACKED)
        elif settlement is REJECTED:
            self._remove(entry, DEAD_LETTERED)
        elif settlement is FAILED:
            entry.failed_attempts += 1
            entry.delivery_count += 1
            limit = self.plan.max_delivery_attempts
            if limit and entry.failed_attempts >= limit:
                self._remove(entry, DEAD_LETTERED)
            else:
                self._return(entry, count=False)
                self._counted(entry)
        else:
            self._return(entry, count=False)  # released or modified: unchanged (AMQP 3.4.4)

    def refuse_here(self, consumer: Consumer, entry: Entry, settlement: Settlement) -> None:
        """Modified with undeliverable-here: like `settle` (FAILED or MODIFIED), but the entry
        is never offered to this consumer again."""
        held = self._in_flight.get(consumer)
        if held is None or entry not in held:
            return
        refused = getattr(entry, "refused_by", None)
        if refused is None:
            entry.refused_by = refused = set()
        refused.add(consumer)
        self.settle(consumer, entry, settlement)  # `_return` sees refused_by: held back

    def rewrite(self, entry: Entry, payload: bytes) -> None:
        """The same message with new bytes (a header field changed) while this queue holds it,
        ready or in flight: its size counts from now on."""
        grown = len(payload) - len(entry.payload)
        entry.payload = payload
        self.bytes += grown
        self.budget.used += grown

    def _return(self, entry: Entry, *, count: bool) -> None:
        if count:
            entry.delivery_count += 1
            self._counted(entry)
        if self._returns_fresh:
            entry = _fresh(entry)
        entry.state = READY
        self.depth += 1
        key = entry.id if self._levels is None else _return_key(entry)
        if getattr(entry, "refused_by", None):
            heapq.heappush(self._held_back, (key, entry))
        elif self._groups is None or not self._parked_with_owner(key, entry):
            heapq.heappush(self._returned, (key, entry))
        if entry.expires_at:
            # Its deadline may have been popped while it was out: the reaper must see it again.
            heapq.heappush(self._expiring, (entry.expires_at, entry.id, entry))

    def _counted(self, entry: Entry) -> None:
        if entry.journaled and self.on_counted is not None:
            self.on_counted(self, entry)

    def _remove(self, entry: Entry, reason: Removal) -> None:
        entry.state = GONE
        self._count_out(entry)
        if reason is EXPIRED:
            self.expired += 1
        elif reason is DEAD_LETTERED:
            self.dead_lettered += 1
        self.on_removed(self, entry, reason)

    # ------------------------------------------------------------------ housekeeping

    def reap(self, now_ms: int) -> int:
        """Removes every ready entry whose deadline passed, consumer or not; returns how many."""
        reaped = 0
        heap = self._expiring
        while heap and heap[0][0] <= now_ms:
            entry = heapq.heappop(heap)[2]
            if entry.state is READY:
                self.depth -= 1
                self._remove(entry, EXPIRED)
                reaped += 1
            elif entry.state is SCHEDULED:  # TTL applies while it waits for its time too
                self._remove(entry, EXPIRED)
                reaped += 1
        return reaped

    def take_ready(self, limit: int) -> list[Entry]:
        """Takes up to `limit` ready entries out of the queue for a hand-off (drain).

        They are IN_FLIGHT to nobody; `finish_hand_off` removes them once the other side owns them,
        `undo_hand_off` puts them back if it refused.
        """
        taken: list[Entry] = []
        if self._groups is not None:  # a drain takes what was parked for consumers too
            for parked in self._groups.take_parked():
                heapq.heappush(self._returned, (self._key(parked), parked))
        pop = self._pop_ready if self._levels is None else self._pop_prioritized
        while len(taken) < limit:
            entry = pop(0)
            if entry is None:
                break
            entry.state = IN_FLIGHT
            taken.append(entry)
        while self._held_back and len(taken) < limit:
            entry = heapq.heappop(self._held_back)[1]
            if entry.state is READY:
                self.depth -= 1
                entry.state = IN_FLIGHT
                taken.append(entry)
        # Held dead letters move too (a drain empties the queue); at the other end they are
        # messages like the rest, and dead-letter again there, where a dead-letter queue is.
        while self._dead_held and len(taken) < limit:
            entry = self._dead_held.pop(0)
            entry.state = IN_FLIGHT
            taken.append(entry)
        if self._scheduled is not None and len(taken) < limit:
            # They move with their due time in their bytes: scheduled again at the other end.
            for entry in self._scheduled.take_all():
                if len(taken) < limit:
                    entry.state = IN_FLIGHT
                    taken.append(entry)
                else:
                    self._scheduled.push(entry, entry.deliver_at)
        return taken

    def hold_dead(self, entry: Entry) -> None:
        """Keeps a dead letter (already counted in `dead_lettered` and GONE for dispatch) that
        has nowhere to go: held, in bytes, until `release_dead`."""
        entry.state = GONE
        self._dead_held.append(entry)
        size = len(entry.payload)
        self.bytes += size
        self.budget.used += size

    def release_dead(self) -> list[Entry]:
        """Every held dead letter, oldest first, no longer counted here (it moves on)."""
        released, self._dead_held = self._dead_held, []
        for entry in released:
            self._count_out(entry)
        return released

    @property
    def dead_letters_held(self) -> int:
        return len(self._dead_held)

    def finish_hand_off(self, entry: Entry) -> None:
        if entry.state is IN_FLIGHT:
            self.dequeued += 1
            self._remove(entry, DRAINED)

    def undo_hand_off(self, entry: Entry) -> None:
        if entry.state is IN_FLIGHT:
            self._return(entry, count=False)

    def purge(self) -> int:
        """Removes everything (the queue is being deleted); returns how many entries went."""
        gone = 0
        for entry in self.snapshot():
            entry.state = GONE
            self._count_out(entry)
            self.on_removed(self, entry, DELETED)
            gone += 1
        for held in self._in_flight.values():
            for entry in held:
                entry.state = GONE
                self._count_out(entry)
                self.on_removed(self, entry, DELETED)
                gone += 1
            held.clear()
        for entry in self._dead_held:
            self._count_out(entry)
            self.on_removed(self, entry, DELETED)
            gone += 1
        for entry in self._scheduled.take_all() if self._scheduled is not None else ():
            entry.state = GONE
            self._count_out(entry)
            self.on_removed(self, entry, DELETED)
            gone += 1
        self._dead_held.clear()
        self._ready.clear()
        for level in self._levels or ():
            level.clear()
        self._returned.clear()
        self._held_back.clear()
        self._expiring.clear()
        for selection in self._selections.values():
            selection.waiting.clear()
            selection.passed_over.clear()
        self._stale = 0
        self.depth = 0
        return gone


def _fresh(entry: Entry) -> Entry:
    """The same message as a new Entry; the old one is GONE for whoever still refers to it
    (the ready deque's stale references, a selection's waiting list)."""
    fresh = Entry(entry.id, entry.payload, entry.journaled, entry.expires_at, entry.delivery_count)
    fresh.failed_attempts = entry.failed_attempts
    priority = getattr(entry, "priority", None)
    if priority is not None:
        fresh.priority = priority
    refused = getattr(entry, "refused_by", None)
    if refused is not None:
        fresh.refused_by = refused
    group = getattr(entry, "group", None)
    if group is not None:
        fresh.group = group
    entry.state = GONE
    return fresh


def _return_key(entry: Entry) -> int:
    """A redelivery's key in a prioritized queue: higher levels first, then by id; at the
    default level it is the id, as in a queue that never saw a priority."""
    return entry.id - (priority_of(entry) - DEFAULT_PRIORITY) * LEVEL_SHIFT


def _by_id(entry: Entry) -> int:
    return entry.id


def _by_key(item: tuple[int, Entry]) -> int:
    return item[0]


def _ignore(_queue: Queue, _entry: Entry, _reason: Removal) -> None:
    return None
