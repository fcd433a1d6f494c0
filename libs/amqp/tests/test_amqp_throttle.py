"""The login throttle alone, on a fake clock: free failures, then a doubling back-off, then a
refusal before anything is checked; per peer and per user; a clean peer that proves the password
cheaply is never held up by a flood against its user; failures age out of the window; memory
stays bounded."""

from __future__ import annotations

import pytest
from enmasse.amqp.throttle import LoginThrottle, Verdict, peer_host


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def throttle(clock: Clock, **options: float) -> LoginThrottle:
    settings = {"free_failures": 3, "refuse_after": 6, "window": 60.0, "first_delay": 0.1}
    return LoginThrottle(**{**settings, **options, "clock": clock})  # type: ignore[arg-type]


def fail(limits: LoginThrottle, times: int, *, peer: str = "10.0.0.9", user: str = "app") -> None:
    for _ in range(times):
        limits.failed(peer=peer, user=user)


def test_failures_are_free_then_backed_off_then_refused(clock: Clock) -> None:
    limits = throttle(clock, max_delay=0.3)
    assert limits.verdict(peer="10.0.0.9", user="app", cheap=False) == Verdict()
    fail(limits, 1)
    assert limits.verdict(peer="10.0.0.9", user="app", cheap=False) == Verdict(doubtful=True)
    delays = []
    for _ in range(4):
        fail(limits, 1)
        delays.append(limits.verdict(peer="10.0.0.9", user="app", cheap=False).delay)
    assert delays == [0.0, pytest.approx(0.1), pytest.approx(0.2), pytest.approx(0.3)]
    fail(limits, 1)
    assert limits.verdict(peer="10.0.0.9", user="app", cheap=False) == Verdict(
        refusal="too many failed logins from 10.0.0.9; try again later"
    )
    assert limits.verdict(peer="10.0.0.9", user="app", cheap=True).refusal is not None


def test_a_user_under_attack_is_refused_to_other_peers_unless_they_prove_it_cheaply(
    clock: Clock,
) -> None:
    limits = throttle(clock)
    for attacker in range(6):  # one failure from each of six peers: each peer stays allowed
        fail(limits, 1, peer=f"10.0.1.{attacker}")
    assert limits.verdict(peer="10.0.0.1", user="app", cheap=False) == Verdict(
        refusal="too many failed logins as user 'app'; try again later"
    )
    assert limits.verdict(peer="10.0.0.1", user="app", cheap=True) == Verdict(), "clean peer"
    assert limits.verdict(peer="10.0.1.0", user="app", cheap=True).refusal == (
        "too many failed logins as user 'app'; try again later"
    ), "a peer that failed does not get the cheap way round"
    assert limits.verdict(peer="10.0.0.1", user="other", cheap=False) == Verdict()


def test_failures_age_out_of_the_window(clock: Clock) -> None:
    limits = throttle(clock)
    fail(limits, 6)
    assert limits.verdict(peer="10.0.0.9", user="app", cheap=False).refusal is not None
    clock.now += 59.0
    assert limits.verdict(peer="10.0.0.9", user="app", cheap=False).refusal is not None
    clock.now += 2.0
    assert limits.verdict(peer="10.0.0.9", user="app", cheap=False) == Verdict()


def test_memory_is_bounded(clock: Clock) -> None:
    limits = throttle(clock, max_tracked=100)
    for n in range(1000):
        limits.failed(peer=f"10.1.{n // 256}.{n % 256}", user=f"user-{n}")
        clock.now += 0.001
    assert len(limits._peers._times) == 100
    assert len(limits._users._times) == 100
    fail(limits, 50)  # one key keeps at most refuse_after timestamps
    assert len(limits._peers._times["10.0.0.9"]) == 6
    assert limits.verdict(peer="10.1.0.0", user="user-0", cheap=False) == Verdict(), "forgotten"


def test_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="free_failures < refuse_after"):
        LoginThrottle(free_failures=5, refuse_after=5)


@pytest.mark.parametrize(
    ("peer", "host"),
    [("127.0.0.1:50123", "127.0.0.1"), ("::1:50123", "::1"), ("somewhere", "somewhere")],
)
def test_failures_count_per_host(peer: str, host: str) -> None:
    assert peer_host(peer) == host
