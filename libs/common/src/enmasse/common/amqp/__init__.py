"""AMQP 1.0 for EnMasse-py's message plane, on proton-c without proton's reactor.

- `engine`: one epoll loop driving many connections; routers, brokers and fast clients build on it.
- `codec`: encode a message once, read its header / `to` without decoding the body.
- `client`: blocking senders and receivers on the engine, for tests, benches and tools.
"""

from enmasse.common.amqp.engine import (
    Condition,
    Connection,
    ConnectionHandler,
    Delivery,
    Engine,
    Link,
    LinkClosed,
    Outcome,
    Terminus,
    Timer,
)

__all__ = [
    "Condition",
    "Connection",
    "ConnectionHandler",
    "Delivery",
    "Engine",
    "Link",
    "LinkClosed",
    "Outcome",
    "Terminus",
    "Timer",
]
