"""A flood of wrong passwords against a listener that hashes them (scrypt, as a router does),
while a good client logs in over and over: every good login gets in.

The flood: 1,000 SASL PLAIN logins with wrong passwords from one peer (127.0.0.2: a process of
its own, this file run as a script, so that its work does not share the listener's interpreter;
raw sockets, four threads, each login bounded by a socket timeout, the whole flood by a
deadline), as another user whose password is not remembered (so each check that runs is a scrypt
hash, tens of milliseconds) and, one in four, as the good client's own user. The good client:
our blocking `Client` from 127.0.0.1, alternating SCRAM-SHA-256 and a remembered PLAIN password,
until the flood is over. The listener runs the default `LoginThrottle`: the flood's first
failures are checked (on the doubtful lane after the first), then backed off, then turned away
before anything is hashed. What is asserted: every good login in, every flood login refused, far
fewer hashes than flood logins. What is printed, not asserted: the good logins' latency before
and during the flood (client engine start-up included), and what became of the flood's logins.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from enmasse.amqp import sasl
from enmasse.amqp.client import Client
from enmasse.amqp.engine import ConnectionHandler
from enmasse.common.passwords import ScramKeys, hash_password, scram_keys, verify_password

USER, PASSWORD = "app", "demo-password"
OTHER = "ops"  # never logged in: every check of its password hashes
FLOOD, FLOOD_THREADS, FLOOD_DEADLINE = 1000, 4, 180.0
ATTACKER = "127.0.0.2"


class Remembering:
    """The endpoints' way with PLAIN (`enmasse.amqp.logins.UserLogins`): scrypt hashes checked on
    a login thread, a good password remembered as an HMAC; SCRAM keys beside."""

    def __init__(self) -> None:
        self.stored = {USER: hash_password(PASSWORD), OTHER: hash_password("ops-password")}
        self.keys = {m: scram_keys(PASSWORD, mechanism=m) for m in ("SCRAM-SHA-256",)}
        self.key = secrets.token_bytes(32)
        self.remembered: dict[str, bytes] = {}
        self.hashed = 0

    def mechanisms(self, *, encrypted: bool) -> tuple[str, ...]:
        return ("SCRAM-SHA-256", "PLAIN")

    def recall(self, user: str, password: str) -> bool | None:
        if user not in self.stored:
            return False
        known = self.remembered.get(user)
        return None if known is None else hmac.compare_digest(known, self._mac(password))

    def check(self, user: str, password: str) -> bool:
        self.hashed += 1
        if not verify_password(password, self.stored[user]):
            return False
        self.remembered[user] = self._mac(password)
        return True

    def scram_keys(self, mechanism: str, user: str) -> ScramKeys | None:
        return self.keys.get(mechanism) if user == USER else None

    def _mac(self, password: str) -> bytes:
        return hmac.new(self.key, password.encode(), hashlib.sha256).digest()


def wrong_login(port: int, n: int) -> int:
    """One wrong-password PLAIN login from ATTACKER: its sasl-outcome code (-1: none came)."""
    user = USER if n % 4 == 0 else OTHER
    init = sasl.init_frame("PLAIN", f"\0{user}\0guess-{n}".encode())
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as raw:
        raw.settimeout(15)
        raw.bind((ATTACKER, 0))
        raw.connect(("127.0.0.1", port))
        raw.sendall(sasl.SASL_HEADER + init)
        got = b""
        while chunk := raw.recv(4096):
            got += chunk
            outcome = got.find(b"\x00\x53\x44")
            if outcome >= 0 and len(got) >= outcome + 8:
                return got[outcome + 7]
    return -1


def flood(port: int) -> Counter[int]:
    """The whole flood: its sasl-outcome codes, counted."""
    outcomes: Counter[int] = Counter()
    numbers = iter(range(FLOOD))
    lock = threading.Lock()
    deadline = time.monotonic() + FLOOD_DEADLINE

    def work() -> None:
        while time.monotonic() < deadline:
            with lock:
                n = next(numbers, None)
            if n is None:
                return
            try:
                code = wrong_login(port, n)
            except OSError:
                code = -1
            with lock:
                outcomes[code] += 1

    threads = [threading.Thread(target=work, name=f"flood-{i}") for i in range(FLOOD_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(FLOOD_DEADLINE + 30)
    return outcomes


class Attacker:
    """The flood in a process of its own; `outcomes` once it is over."""

    def __init__(self, port: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__)), str(port)], stdout=subprocess.PIPE, text=True
        )

    def running(self) -> bool:
        return self.process.poll() is None

    def outcomes(self) -> Counter[int]:
        out, _ = self.process.communicate(timeout=FLOOD_DEADLINE + 60)
        return Counter({int(code): n for code, n in json.loads(out).items()})


def good_login(port: int, mechanism: str) -> float:
    """Seconds from nothing to an open connection logged in as USER."""
    started = time.perf_counter()
    client = Client(
        "127.0.0.1", port, user=USER, password=PASSWORD, mechanisms=(mechanism,), timeout=15
    )
    took = time.perf_counter() - started
    client.close()
    return took


def percentiles(seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    cuts = statistics.quantiles(ms, n=100, method="inclusive")
    return (
        f"n={len(ms)} p50={cuts[49]:.1f} ms p90={cuts[89]:.1f} ms p99={cuts[98]:.1f} ms "
        f"max={ms[-1]:.1f} ms"
    )


def test_a_flood_of_wrong_passwords_never_keeps_a_good_login_out(amqp_listener) -> None:
    users = Remembering()
    _engine, port = amqp_listener(ConnectionHandler, authenticator=users)
    good_login(port, "PLAIN")  # its password checked once, then remembered
    before = {m: [good_login(port, m) for _ in range(20)] for m in ("SCRAM-SHA-256", "PLAIN")}

    started = time.monotonic()
    attacker = Attacker(port)
    during: dict[str, list[float]] = {"SCRAM-SHA-256": [], "PLAIN": []}
    try:
        while attacker.running() and len(during["PLAIN"]) < 2000:
            for mechanism, took in during.items():
                took.append(good_login(port, mechanism))  # raises if the login is refused
    finally:
        outcomes = attacker.outcomes()
    flood_seconds = time.monotonic() - started

    print(
        f"\nflood: {sum(outcomes.values())} wrong logins from {ATTACKER} in {flood_seconds:.1f} s"
    )
    print(f"  outcomes: {dict(sorted(outcomes.items()))} (1 checked and wrong, 4 turned away)")
    print(f"  passwords hashed: {users.hashed} (one of them the good client's first login)")
    for mechanism in during:
        print(f"good {mechanism:<13} before: {percentiles(before[mechanism])}")
        print(f"good {mechanism:<13} during: {percentiles(during[mechanism])}")
    assert sum(outcomes.values()) == FLOOD
    assert set(outcomes) <= {sasl.AUTH_FAILED, sasl.SYS_TEMP}, "every wrong login refused"
    assert outcomes[sasl.SYS_TEMP] > FLOOD // 2, "most of the flood turned away unhashed"
    assert users.hashed < 60  # the good client's first login, and the flood's first failures
    assert all(during.values()), "the good client logged in during the flood"


if __name__ == "__main__":  # the attacker's process: `python this-file PORT`
    print(json.dumps(flood(int(sys.argv[1]))))
