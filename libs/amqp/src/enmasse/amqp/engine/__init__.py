"""The AMQP 1.0 engine every EnMasse-py message-plane process runs on: one epoll loop, one thread.

What flows in: bytes from sockets (listeners accept peers; `connect` dials out), calls from the
process's own code (send, flow, settle, close, timers) and callables handed over from other threads
(`call_soon_threadsafe`, `submit`, `call`: the asyncio/gRPC admin thread). What flows out: calls on
a `ConnectionHandler` per connection (peer opened, session begun, link attached, message arrived,
outcome came back, credit changed, link detached, connection closed) and bytes to the sockets.

Why it is built so: a router or broker written on proton's reactor (Container + MessagingHandler)
spends most of its time creating Python wrapper objects and dispatching events, and tops out near
5,000 messages/s per process here. This engine drives proton-c's protocol engine directly on raw
pointers and never decodes a body (header and `to` are read lazily by `codec` only when asked).
Its per-message calls into proton go through `enmasse.amqp_hotpath`, a small C extension: the
cffi binding python-qpid-proton ships costs about 230 ns a call (it hands the GIL back and forth
and wraps every result), and a forwarded message needed 20-25 of them. Through amqp_hotpath one
call reads proton's event collector up to the next event a handler wants (a complete transfer
comes back received, advanced, and settled if it came pre-settled), one call sends, one settles,
and socket bytes go straight between the socket and proton's buffers. Pointers cross as ints;
everything that is not per message (attach, termini, conditions, SASL, TLS) still calls the cffi
binding. Figures (client to client, through a bare forwarder) are in bench/RESULTS.md.

The parts, each importing only those above it in this list:

- `loop`: the epoll loop, timers, call_soon / call_soon_threadsafe / submit / call, run / stop.
  Knows no AMQP.
- `endpoints`: what handlers see (ConnectionHandler, Connection, Link, Delivery; Terminus from
  `wire`) and where connections come from (`Switchboard`: listen, accept, connect).
- `security`: our own SASL and TLS in front of proton for listeners with an authenticator and
  for connections that log in with SCRAM (`Guard`: the login throttle, remembered logins, the
  trusted and doubtful login lanes, PLAIN checks, the in-memory TLS session's glue).
- `events`: `Engine`, the loop's AMQP side: socket bytes in and out and the per-message dispatch
  of proton's events through amqp_hotpath (bound to proton-c at import); it holds a Switchboard
  and a Guard.
- `large`: large incoming deliveries, read out of proton in chunks and joined once, and those over
  a link's size limit thrown away as they come and rejected for their sender alone.

Threading contract: everything here runs on the engine's thread. Build listeners and connections
before `run()` or from engine callbacks/timers; from any other thread, use
`call_soon_threadsafe(fn)` / `submit(fn) -> Future` / `await call(fn)` (they wake the loop) or
`stop()`.

Lifetimes: `on_connection_close` is called exactly once per connection, whoever closed it and
however (clean close, peer's error, socket lost, garbage, idle timeout). `on_link_detach` is called
exactly once per link that was opened (accepted by us, or opened by us), before the connection's
close. Deliveries settle once; settling a delivery of a link or connection that has gone is a no-op.
"""

from enmasse.amqp.engine.endpoints import (
    Connection,
    ConnectionClosed,
    ConnectionHandler,
    Delivery,
    Link,
    LinkClosed,
)
from enmasse.amqp.engine.events import Engine
from enmasse.amqp.engine.loop import Timer, settle_gc_for_message_loop
from enmasse.amqp.wire import Condition, Outcome, Terminus, Tls

__all__ = [  # Outcome, Condition, Terminus and Tls live in `wire`; importable from here too
    "Condition",
    "Connection",
    "ConnectionClosed",
    "ConnectionHandler",
    "Delivery",
    "Engine",
    "Link",
    "LinkClosed",
    "Outcome",
    "Terminus",
    "Timer",
    "Tls",
    "settle_gc_for_message_loop",
]
