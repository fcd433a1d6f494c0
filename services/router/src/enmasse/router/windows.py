"""How much credit a sender into the router holds: a window of messages, bounded in bytes.

In: the window in messages (`PRODUCER_WINDOW`, `TRANSIT_WINDOW`), a byte budget, and what the
sender's deliveries weighed since its credit was last topped up (count and bytes), or, before any
arrived, the largest message the router allows. Out: the credit to hold (the rule itself,
`window` and `first_window`, is the broker's too: `enmasse.amqp.windows`).

Why: credit counts messages, and what a sender may have waiting at the router while consumers are
slow is its whole window. 1,000 messages of 100 bytes are 100 kB; 1,000 of 1 MB would be 1 GB
for one producer. So the window shrinks as messages grow, to hold about `budget` bytes, and
never below one message (a sender always gets on). Before the first top-up the router knows
nothing of the sizes a sender will use: the first window is bounded only when a max message size
is configured.

`refill` applies it to a link, with the router's windows and budgets.
"""

from __future__ import annotations

from enmasse.amqp.engine import Link
from enmasse.amqp.windows import window
from enmasse.router.points import (
    PRODUCER_BYTES,
    PRODUCER_WINDOW,
    TRANSIT_BYTES,
    TRANSIT_IN,
    TRANSIT_WINDOW,
    LinkState,
)


def refill(link: Link, state: LinkState) -> None:
    """Tops a sender's credit up to its window (a producer's, or a neighbour's on a transit
    link), the window first resized to what its deliveries since the last top-up weighed."""
    if state.unflowed:
        messages, budget = (
            (TRANSIT_WINDOW, TRANSIT_BYTES)
            if state.role is TRANSIT_IN
            else (PRODUCER_WINDOW, PRODUCER_BYTES)
        )
        state.window = window(
            messages=messages,
            budget=budget,
            taken=state.unflowed,
            taken_bytes=state.unflowed_bytes,
        )
    missing = state.window - link.credit
    if missing > 0:
        link.flow(missing)
    state.unflowed = 0
    state.unflowed_bytes = 0
