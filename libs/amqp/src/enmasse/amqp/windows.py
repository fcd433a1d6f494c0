"""How much credit a sender holds: a window of messages, bounded in bytes.

In: the window in messages, a byte budget, and what the sender's deliveries weighed since its
credit was last topped up (count and bytes), or, before any arrived, the largest message the
receiver allows. Out: the credit to hold. Pure functions: the router (its producers' and
neighbours' links) and the broker (its producers' links, a standard space's router sharing one
among its producers) each keep their own windows, budgets and counters, and ask here.

Why: credit counts messages, and what a sender may have in flight while the receiver is slow
is its whole window. 1,000 messages of 100 bytes are 100 kB; 1,000 of 100 MiB would be 100 GB
for one link. So the window shrinks as messages grow, to hold about `budget` bytes, and never
below one message (a sender always gets on). Before the first top-up the receiver knows nothing
of the sizes a sender will use: the first window is bounded only when a max message size is
configured. What it costs per message is the caller's: one addition of the size to a counter.
"""

from __future__ import annotations


def window(*, messages: int, budget: int, taken: int, taken_bytes: int) -> int:
    """The credit to hold, given the `taken` deliveries (`taken_bytes` in all) since the last
    top-up: `messages`, fewer when they were large."""
    if taken <= 0 or taken_bytes <= 0:
        return messages
    return max(1, min(messages, budget * taken // taken_bytes))


def first_window(*, messages: int, budget: int, max_message_size: int) -> int:
    """The credit a new sender gets: `messages`, fewer when even that many messages of the
    largest allowed size would exceed `budget` (max_message_size 0: no limit configured)."""
    if max_message_size <= 0:
        return messages
    return max(1, min(messages, budget // max_message_size))
