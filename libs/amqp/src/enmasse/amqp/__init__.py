"""AMQP 1.0 for EnMasse-py's message plane, on proton-c without proton's reactor.

- `engine`: one epoll loop driving many connections; routers, brokers and fast clients build on it
  (a package: `loop`, `endpoints`, `security`, `events`; its docstring tells which does what).
- `codec`: encode a message once, read its header / `to` without decoding the body.
- `client`: blocking senders and receivers on the engine (tests, tools) and bulk runners (benches).
- `wire`: outcomes, conditions, termini, TLS settings and their proton-c form (attach/open time).
- `sasl`: SASL done by the engine (SCRAM-SHA-512/256, PLAIN, ANONYMOUS), so a listener checks
  logins with our code and a client logs in with SCRAM.
- `throttle`: failed logins per peer and per user, and the back-off and refusal they earn.
- `tls`: TLS done by the engine in memory, for listeners that check passwords (amqps + PLAIN) and
  clients that log in with our SASL (amqps + SCRAM).
- `selector`: JMS message selectors (the AMQP selector filter), parsed once per link, evaluated
  per message.
- `windows`: how much credit a sender holds, in messages bounded in bytes (the router's and the
  broker's rule; each keeps its own windows, budgets and counters).

A process on the engine, in short (everything runs on the engine's thread):

    class Queue(ConnectionHandler):                      # one handler per connection
        def on_link_attach(self, link):                  # the peer attached
            if link.address not in known:
                link.refuse(Condition("amqp:not-found", f"no address '{link.address}'"))
                return
            link.accept()
            if link.is_receiver:                         # the peer sends to us
                link.flow(100)
        def on_message(self, link, delivery):            # delivery.payload: bytes, never decoded
            store(delivery.payload, durable=delivery.durable)
            delivery.settle(Outcome.ACCEPTED)
            link.flow(1)
        def on_link_credit(self, link):                  # the peer gave us credit to send
            while link.credit > 0 and backlog:
                link.send(backlog.popleft(), context=...)
        def on_outcome(self, link, delivery, outcome):   # the peer settled what we sent
            ...

    engine = Engine(container_id="broker-1")
    port = engine.listen(host="127.0.0.1", port=0, handler_factory=Queue)
    engine.run()                                         # or engine.run_in_thread()

From another thread (asyncio admin): `await engine.call(fn)`.
"""

from enmasse.amqp.engine import (
    Condition,
    Connection,
    ConnectionClosed,
    ConnectionHandler,
    Delivery,
    Engine,
    Link,
    LinkClosed,
    Outcome,
    Terminus,
    Timer,
    Tls,
)

__all__ = [
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
]
