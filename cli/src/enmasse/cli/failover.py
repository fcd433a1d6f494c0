"""A space's endpoints, and going on through the next one when the one in use goes away.

In: the endpoints a verb may use, in order (the amqp endpoint of each of a space's routers, as
its status lists them, or the `--url` list) and how to connect to one. Out: a connected client,
and after a lost connection the next endpoint's (`Failover.connect`, `Failover.lost`).

Why: a space with several routers gives its clients path redundancy only if they use it. When
the router a producer or consumer talks to dies, or closes the connection to leave the space,
the verb goes on through another router instead of failing. The rule, like the failover lists
of Qpid clients: keep the endpoint that answers; when its connection is lost, try the next ones
in order, wrapping around, until one answers or the verb's deadline passes. A peer that says no
(an attach refused, a login failed) has not been lost: another router would say the same, so
the refusal is reported as it is.

What going on promises (the verbs in messaging.py keep it): a send is at least once across a
failover, since the message whose outcome never came back is sent again through the next router
(a queue may then hold it twice, a consumer may see it twice); a receive takes what is left of
its count through the next router, and a message it accepted on the lost connection whose
disposition never reached the broker comes again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Generic, TypeVar

from enmasse.amqp.client import AmqpError, Client

EndpointT = TypeVar("EndpointT")

# How long a verb gives the engine to report the connection's end after a link of it ended:
# both are reported in one engine turn, so this is only ever waited for when the connection
# stays up (the peer detached the link and nothing else).
CONNECTION_END_WAIT = 0.5
# A pause between rounds over the whole list, so a space whose routers are all restarting is
# not dialled in a tight loop.
ROUND_PAUSE = 0.2


class NoEndpointAnswered(Exception):
    """Every endpoint was tried until the deadline; carries the last one's error."""

    def __init__(self, endpoint: object, error: BaseException) -> None:
        self.endpoint = endpoint
        self.error = error
        super().__init__(f"cannot connect to {endpoint}: {error or 'timed out'}")


class Failover(Generic[EndpointT]):
    """The endpoints of one verb, the one in use first."""

    def __init__(
        self,
        endpoints: Sequence[EndpointT],
        *,
        connect: Callable[[EndpointT], Client],
        deadline: float,
    ) -> None:
        if not endpoints:
            raise ValueError("a failover needs at least one endpoint")
        self.endpoints = tuple(endpoints)
        self._connect = connect
        self._deadline = deadline  # time.monotonic() after which no round starts
        self._current = 0
        self.failovers = 0  # connections lost and replaced, for the verb's summary

    @property
    def current(self) -> EndpointT:
        return self.endpoints[self._current]

    def connect(self) -> Client:
        """A client of the endpoint in use, else of the next that answers, in order and wrapping
        around, until the deadline (at least one round); NoEndpointAnswered when none did. A
        round in which every endpoint refused (the peer's own condition, e.g. a failed login)
        is the last: another round would hear the same."""
        while True:
            error: BaseException = TimeoutError()
            failed_at = self.current
            refused_by_all = True
            for _ in range(len(self.endpoints)):
                try:
                    return self._connect(self.current)
                except (OSError, AmqpError, FutureTimeout) as failed:
                    error, failed_at = failed, self.current
                    refused_by_all &= isinstance(failed, AmqpError) and failed.condition is not None
                    self._current = (self._current + 1) % len(self.endpoints)
            if refused_by_all or time.monotonic() + ROUND_PAUSE >= self._deadline:
                raise NoEndpointAnswered(failed_at, error)
            time.sleep(ROUND_PAUSE)

    def reconnect(self, client: Client) -> Client:
        """After `client`'s connection was lost: closes what is left of it and connects to the
        next endpoint (then on around the list, as `connect` does)."""
        client.close()
        self.failovers += 1
        self._current = (self._current + 1) % len(self.endpoints)
        return self.connect()


def lost(client: Client) -> bool:
    """True when the client's connection has ended (lost, or closed by the peer): the error a
    verb just saw is then a reason to go on elsewhere, not the peer's answer."""
    try:
        client.closed_with.result(CONNECTION_END_WAIT)
    except FutureTimeout:
        return False
    return True
