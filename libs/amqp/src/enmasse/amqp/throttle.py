"""Failed logins, counted per peer and per user, and what the next login of either may do.

What flows in: each failed login (`failed(peer=, user=)`: the peer's host, the user name the
client gave) and, before a login is checked, the question `verdict(peer=, user=, cheap=)`. What
flows out: a `Verdict`: turn the login away at once (and why), or check it after a back-off delay,
on the doubtful lane when the peer or the user failed lately.

Why it is built so: a wrong password costs the server a scrypt hash (tens of milliseconds on a
login thread), so a flood of them would queue in front of every good login, and guessing would
be as fast as the server can hash. Counting failures in a sliding window, per peer and per user,
bounds both: the first few failures are free (people mistype), then each further attempt waits
longer (`first_delay`, doubling up to `max_delay`; the engine waits with a timer, holding no
thread), and past `refuse_after` the attempt is turned away before anything is checked. Only
checks that ran and failed count; turned-away attempts do not, so a refusal lifts once the
failures age out of the window.

A flood against one user must not lock that user out: a login whose answer costs nothing
(`cheap`: a remembered PLAIN password, a SCRAM proof) from a peer that has not failed lately goes
through without delay even while the user is refused; an attacker's peer has failed, so it does
not. Nothing here knows sockets or clocks beyond `clock` (time.monotonic by default): tests drive
it with a fake one. Memory is bounded: at most `max_tracked` peers and users each (the least
recently failed are forgotten first), at most `refuse_after` timestamps each.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LoginThrottle", "Verdict", "peer_host"]


@dataclass(frozen=True)
class Verdict:
    """What a login may do now: `refusal` (turned away at once, with this reason), or be checked
    after `delay` seconds, on the doubtful lane when `doubtful`."""

    refusal: str | None = None
    delay: float = 0.0
    doubtful: bool = False


def peer_host(peer: str) -> str:
    """`127.0.0.1:50123` -> `127.0.0.1`: failures count per host, whatever port a client uses."""
    host, _, _port = peer.rpartition(":")
    return host or peer


class _Failures:
    """Recent failure times per key, oldest key first."""

    def __init__(self, *, keep: int, max_tracked: int) -> None:
        self._keep = keep
        self._max_tracked = max_tracked
        self._times: dict[str, deque[float]] = {}

    def add(self, key: str, now: float) -> None:
        times = self._times.pop(key, None) or deque(maxlen=self._keep)
        times.append(now)
        self._times[key] = times  # re-inserted: the most recently failed key is last
        while len(self._times) > self._max_tracked:
            del self._times[next(iter(self._times))]

    def count(self, key: str, *, since: float) -> int:
        times = self._times.get(key)
        if times is None:
            return 0
        while times and times[0] < since:
            times.popleft()
        if not times:
            del self._times[key]
            return 0
        return len(times)


class LoginThrottle:
    """One listener's failed logins and the back-off and refusal they earn."""

    def __init__(
        self,
        *,
        free_failures: int = 5,
        refuse_after: int = 20,
        window: float = 300.0,
        first_delay: float = 0.05,
        max_delay: float = 5.0,
        max_tracked: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 <= free_failures < refuse_after:
            raise ValueError("need 0 <= free_failures < refuse_after")
        self.free_failures = free_failures
        self.refuse_after = refuse_after
        self.window = window
        self.first_delay = first_delay
        self.max_delay = max_delay
        self._clock = clock
        self._peers = _Failures(keep=refuse_after, max_tracked=max_tracked)
        self._users = _Failures(keep=refuse_after, max_tracked=max_tracked)

    def failed(self, *, peer: str, user: str) -> None:
        """A login from `peer` (a host) as `user` was checked and was wrong."""
        now = self._clock()
        self._peers.add(peer, now)
        self._users.add(user, now)

    def verdict(self, *, peer: str, user: str, cheap: bool) -> Verdict:
        """What a login from `peer` as `user` may do now; `cheap`: its answer costs no hashing."""
        since = self._clock() - self.window
        by_peer = self._peers.count(peer, since=since)
        by_user = self._users.count(user, since=since)
        if by_peer >= self.refuse_after:
            return Verdict(refusal=f"too many failed logins from {peer}; try again later")
        if cheap and by_peer == 0:
            return Verdict()  # a clean peer that proves the password without cost
        if by_user >= self.refuse_after:
            return Verdict(refusal=f"too many failed logins as user '{user}'; try again later")
        return Verdict(delay=self.backoff(max(by_peer, by_user)), doubtful=bool(by_peer or by_user))

    def backoff(self, failures: int) -> float:
        """The wait before checking a login after `failures` recent ones: none while they are
        free, then `first_delay` doubling with each, at most `max_delay`."""
        beyond = failures - self.free_failures
        if beyond < 0:
            return 0.0
        return min(self.first_delay * 2.0 ** min(beyond, 30), self.max_delay)
