"""The engine's loop: one thread, one epoll, turns that end with the AMQP side's own work.

What flows in: file descriptors epoll finds ready (the sockets of connections, listening sockets,
the eventfd that wakes the loop), timers set on the engine thread (`call_later`), callables queued
on it (`call_soon`) and handed over from other threads (`call_soon_threadsafe`, `submit`, `call`:
the asyncio/gRPC admin thread). What flows out: calls to the hooks the AMQP side fills in
(`events.Engine`): a ready connection socket goes to `_on_io`, a ready listening socket to
`_accept`, and every turn ends with `_process_events` (proton's events to handlers) and
`_flush_dirty` (what connections have to send, to their sockets).

Why it is built so: every connection of a process is served by this one thread, so the state of
a router or broker has one owner and needs no locks; other threads reach it only through the
queue `call_soon_threadsafe` fills (`submit` and `call` are built on it), which wakes the loop
through an eventfd. A turn runs only the callables queued when it starts, so a thread that keeps
submitting cannot starve the sockets; a timer set by a timer waits for the next turn. The loop
knows no AMQP: `Loop` is generic in what a served socket and a listening socket stand for, and
`events.Engine` is the one subclass (Connection, Listener).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import heapq
import itertools
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import structlog

__all__ = ["READS_PER_WAKEUP", "Loop", "Timer", "settle_gc_for_message_loop"]

C = TypeVar("C")  # what a served socket stands for (a connection)
L = TypeVar("L")  # what a listening socket stands for (a listener)
T = TypeVar("T")

log = structlog.get_logger("enmasse.amqp")

# Reads one connection gets per turn: proton takes a frame or so per read, and a large message
# must not take one turn per frame, but one busy peer must not hold up the others either.
READS_PER_WAKEUP = 8


def settle_gc_for_message_loop() -> None:
    """Call once, after start-up, in a process whose main work is the engine loop (router, broker,
    bench clients).

    Every message makes a few short-lived objects (deliveries, payload bytes, tuples) that
    reference counting frees at once; with CPython's default threshold (a young-generation
    collection every 700 allocations) the cyclic collector still walks whatever a batch of
    deliveries holds at that moment: about 2,000 of the bench forwarder's 77,000 instructions
    per acked message (callgrind, 20,000 messages). Freezing what start-up made (modules,
    configuration) and collecting the young generation every 50,000 allocations keeps that to a
    few hundred, while cyclic garbage (a closed connection and its links) is still collected.
    """
    gc.freeze()
    gc.set_threshold(50_000, 20, 10)


class Timer:
    """A callback scheduled on the engine thread; cancel() before it fires to drop it."""

    __slots__ = ("cancelled", "deadline", "fn")

    def __init__(self, deadline: float, fn: Callable[[], object]) -> None:
        self.deadline = deadline
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Loop(Generic[C, L]):
    """One epoll loop; the AMQP side subclasses it and fills in the hooks at the bottom."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._listeners: dict[int, L] = {}  # by socket fd
        self._conns: dict[int, C] = {}  # by socket fd
        self._dirty: set[C] = set()  # connections with something to send: flushed at turn end
        self._timers: list[tuple[float, int, Timer]] = []
        self._timer_seq = itertools.count()
        self._ready: deque[Callable[[], object]] = deque()
        self._threadsafe: deque[Callable[[], object]] = deque()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wake_fd, select.EPOLLIN)
        self._running = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    def call_later(self, seconds: float, fn: Callable[[], object]) -> Timer:
        """Runs fn on the engine thread after `seconds` (engine thread only)."""
        timer = Timer(time.monotonic() + seconds, fn)
        heapq.heappush(self._timers, (timer.deadline, next(self._timer_seq), timer))
        return timer

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Runs fn on the engine thread at the end of this loop turn (engine thread only)."""
        self._ready.append(fn)

    def call_soon_threadsafe(self, fn: Callable[[], object]) -> None:
        """Runs fn on the engine thread, from any thread; wakes the loop."""
        self._threadsafe.append(fn)
        with contextlib.suppress(OSError):  # engine closed: nothing will run it
            os.eventfd_write(self._wake_fd, 1)

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Runs fn on the engine thread, from any thread; the future gets its result or error.

        From asyncio (the admin/gRPC thread), await `call(fn)` instead.
        """
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn())
            except BaseException as err:
                future.set_exception(err)

        self.call_soon_threadsafe(run)
        return future

    async def call(self, fn: Callable[[], T]) -> T:
        """Runs fn on the engine thread and returns (or raises) what it did: the one way an asyncio
        caller (an admin servicer on its gRPC thread) reaches state the engine thread owns."""
        result: T = await asyncio.wrap_future(self.submit(fn))
        return result

    def run(self) -> None:
        """Runs the loop on this thread until stop()."""
        self._thread = threading.current_thread()
        self._running = True
        poll = self._epoll.poll
        try:
            while not self._stopping:
                for fd, events in poll(self._poll_timeout()):
                    conn = self._conns.get(fd)
                    if conn is not None:
                        try:
                            self._on_io(conn, events)
                        except Exception:
                            self._broken(conn)
                    elif fd == self._wake_fd:
                        self._drain_wakeups()
                    elif fd in self._listeners:
                        self._accept(self._listeners[fd])
                self._run_timers()
                self._run_ready()
                self._process_events()
                self._flush_dirty()
        finally:
            self._running = False
            self._shutdown()

    def run_in_thread(self, *, name: str = "amqp-engine") -> threading.Thread:
        """Starts run() on a daemon thread and returns it."""
        thread = threading.Thread(target=self.run, name=name, daemon=True)
        self._thread = thread
        thread.start()
        return thread

    def stop(self) -> None:
        """Ends run() (from any thread); sockets are closed without AMQP close frames."""
        self._stopping = True
        with contextlib.suppress(OSError):
            os.eventfd_write(self._wake_fd, 1)

    # -- a turn --

    def _poll_timeout(self) -> float:
        if self._ready or self._threadsafe or self._dirty:
            return 0
        timers = self._timers
        while timers and timers[0][2].cancelled:
            heapq.heappop(timers)
        if not timers:
            return 1.0
        return max(0.0, min(1.0, timers[0][0] - time.monotonic()))

    def _drain_wakeups(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._wake_fd)

    def _run_timers(self) -> None:
        timers = self._timers
        if not timers:
            return
        now = time.monotonic()
        due = []
        while timers and timers[0][0] <= now:
            due.append(heapq.heappop(timers)[2])
        # Timers set by these callbacks wait for the next turn, however short their delay.
        for timer in due:
            if not timer.cancelled:
                self._guarded(timer.fn)

    def _run_ready(self) -> None:
        # Only what is queued now: a thread that keeps submitting must not starve the sockets.
        threadsafe = self._threadsafe
        for _ in range(len(threadsafe)):
            self._guarded(threadsafe.popleft())
        ready = self._ready
        for _ in range(len(ready)):
            self._guarded(ready.popleft())

    def _guarded(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception:
            log.exception("engine callback failed", callback=repr(fn))

    def _close_loop(self) -> None:
        """The last step of a shutdown: epoll and the wake-up fd go."""
        self._epoll.close()
        os.close(self._wake_fd)

    # -- the AMQP side's part of a turn (events.Engine) --

    def _on_io(self, conn: C, events: int) -> None:
        """A connection's socket is ready (epoll's events mask)."""
        raise NotImplementedError

    def _broken(self, conn: C) -> None:
        """_on_io raised: an engine bug surfaced on one connection."""
        raise NotImplementedError

    def _accept(self, listener: L) -> None:
        """A listening socket has peers waiting."""
        raise NotImplementedError

    def _process_events(self) -> None:
        """End of turn: what the connections' input made happen, to their handlers."""
        raise NotImplementedError

    def _flush_dirty(self) -> None:
        """End of turn: what the connections have to send, to their sockets."""
        raise NotImplementedError

    def _shutdown(self) -> None:
        """run() is over: close every connection and listener, then `_close_loop`."""
        raise NotImplementedError
