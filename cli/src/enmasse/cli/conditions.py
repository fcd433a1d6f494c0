"""`enmasse wait KIND NAME --for=CONDITION --timeout=S`: block a script until a resource is so.

In: the condition as kubectl spells it, `phase=Active` (any phase: Pending, Configuring, Active,
Failed, Terminating; `jsonpath`-free on purpose) or `delete` (until it is gone), and a deadline.
Out: `address/orders condition met` and exit 0; or, when the deadline passes first, an error
naming what the resource is instead (its phase and status messages) with exit code 3
(`TimedOut`), so a script tells "not yet" (3) from "wrong" (1: an unknown kind, a resource that
does not exist while waiting for a phase, a config service that does not answer).

How: asks the config service (Get) every `POLL_INTERVAL` until the condition holds or the
deadline passes; a Get is cheap and a poll survives a config service restart, where a Watch
stream would have to be resumed. The loop is bounded by the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from enmasse.cli.client import CliError
from enmasse.resources.kinds import object_of
from enmasse.v1 import resources_pb2

POLL_INTERVAL = 0.25
EXIT_TIMED_OUT = 3
DELETE = "delete"


class TimedOut(CliError):
    """The deadline of `wait` passed before the condition held: exit code 3."""

    exit_code = EXIT_TIMED_OUT


@dataclass(frozen=True)
class Condition:
    """`phase=Active` (phase = "Active") or `delete` (phase = "")."""

    phase: str = ""

    @property
    def deletion(self) -> bool:
        return not self.phase


def parse_condition(text: str) -> Condition:
    if text == DELETE:
        return Condition()
    key, sep, value = text.partition("=")
    if key == "phase" and sep and value:
        return Condition(phase=value)
    raise CliError(f"--for={text}: expected --for=phase=PHASE (e.g. phase=Active) or --for=delete")


def phase_of(resource: resources_pb2.Resource) -> str:
    status = getattr(object_of(resource), "status", None)
    return str(status.status.phase) if status is not None else ""


def why_not(resource: resources_pb2.Resource) -> str:
    """`phase Pending: no broker has room`: what the resource is instead."""
    status = getattr(object_of(resource), "status", None)
    if status is None:
        return "it has no phase"
    phase = status.status.phase or "<none>"
    messages = "; ".join(status.status.messages)
    return f"phase {phase}" + (f": {messages}" if messages else "")


def wait_until_met(
    *,
    fetch: Callable[[], resources_pb2.Resource | None],
    condition: Condition,
    what: str,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Until `fetch` (None: not found) shows the condition; TimedOut after `timeout` s."""
    deadline = clock() + timeout
    while True:
        resource = fetch()
        if condition.deletion and resource is None:
            return
        if resource is None:
            raise CliError(f"{what} not found")
        if not condition.deletion and phase_of(resource) == condition.phase:
            return
        if clock() >= deadline:
            wanted = "to be deleted" if condition.deletion else f"phase {condition.phase}"
            raise TimedOut(
                f"timed out after {timeout:g} s waiting for {what} {wanted}: "
                f"{why_not(resource) if not condition.deletion else 'it still exists'}"
            )
        sleep(min(POLL_INTERVAL, max(deadline - clock(), 0.0)))
