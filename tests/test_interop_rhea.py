"""Interop: rhea, a second AMQP 1.0 client library (Node.js), against both kinds of space
(issue #16).

The clients are the small scripts in tests/interop/rhea/ (rhea pinned in its package.json and
package-lock.json; `npm ci` there once per session, here): send.mjs, receive.mjs (with a JMS
selector when given one), server.mjs (answers on ONE sender with no target address: the
anonymous relay) and client.mjs (request-response through a dynamic reply address). They run
as subprocesses with their own time bound (AMQP_TIMEOUT) and ours; what is asserted is what
they print: bodies received, in order, and outcomes.

Where: on the session's `enmasse up` stack (`local_runtime`), a brokered space (its broker is
the endpoint) and a standard space (its router is), each with a MessagingUser. rhea logs in
with PLAIN only (no SCRAM), which both plans take over TLS alone: the scripts use each space's
amqps endpoint, trusting the CA `enmasse up` publishes (<var>/tls/ca.crt) and checking the
endpoint's name, as a tenant's client would. The same scenarios run on both spaces where they
apply: send/receive and request-response; the selector one on the brokered space (a JMS
feature of its broker).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.local_runtime import LocalRuntime

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parent / "interop" / "rhea"
BROKERED, STANDARD = "interop-rhea", "interop-rhea-std"
USER, PASSWORD = "rhea", "rhea-pw"
RUN = 60  # seconds a script may take, from our side (theirs: AMQP_TIMEOUT)
REQUESTS = ["twas brillig", "and the slithy toves", "did gyre and gimble", "in the wabe"]

# (space, plan, {address: (type, plan)})
SPACES = {
    BROKERED: (
        "brokered",
        "brokered-single",
        {
            "orders": ("queue", "brokered-queue"),
            "requests": ("queue", "brokered-queue"),
            "colours": ("queue", "brokered-queue"),
        },
    ),
    STANDARD: (
        "standard",
        "standard-small",
        {
            "orders": ("queue", "standard-small-queue"),
            "requests": ("anycast", "standard-anycast"),
        },
    ),
}


def _manifests() -> str:
    parts = []
    for space, (kind, plan, addresses) in SPACES.items():
        parts.append(f"""---
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {{name: {space}}}
spec: {{type: {kind}, plan: {plan}}}
---
apiVersion: enmasse.io/v1
kind: MessagingUser
metadata: {{name: {USER}, space: {space}}}
spec:
  username: {USER}
  password: {PASSWORD}
  authorization: [{{addresses: ["#"], operations: [send, recv]}}]
""")
        for address, (type_, address_plan) in addresses.items():
            parts.append(f"""---
apiVersion: enmasse.io/v1
kind: Address
metadata: {{name: {address}, space: {space}}}
spec: {{address: {address}, type: {type_}, plan: {address_plan}}}
""")
    return "".join(parts)


@dataclass(frozen=True)
class Endpoint:
    """A space's amqps endpoint as the scripts take it (their environment)."""

    port: int
    ca: Path

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "AMQP_HOST": "127.0.0.1",
            "AMQP_PORT": str(self.port),
            "AMQP_USER": USER,
            "AMQP_PASSWORD": PASSWORD,
            "AMQP_CA": str(self.ca),
            "AMQP_SERVERNAME": "localhost",
            "AMQP_TIMEOUT": str(RUN - 10),
        }


@pytest.fixture(scope="session")
def rhea() -> Path:
    """tests/interop/rhea with its locked packages installed (`npm ci`, once a session)."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("npm (Node.js) is not installed: apt-get install nodejs npm")
    done = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=SCRIPTS,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"npm ci in {SCRIPTS}:\n{done.stderr}"
    return SCRIPTS


@pytest.fixture(scope="module")
def endpoints(local_runtime: LocalRuntime, rhea: Path) -> dict[str, Endpoint]:
    local_runtime.apply(_manifests(), name="interop-rhea.yaml")
    ca = local_runtime.var / "tls" / "ca.crt"
    found = {}
    for space, (_kind, _plan, addresses) in SPACES.items():
        local_runtime.wait_active(space, list(addresses))
        found[space] = Endpoint(port=local_runtime.endpoint(space, "amqps"), ca=ca)
    return found


def node(endpoint: Endpoint, script: str, *args: str) -> list[str]:
    """Runs one script to its end; its output lines. A hang or an exit other than 0 fails."""
    done = subprocess.run(
        ["node", str(SCRIPTS / script), *args],
        cwd=SCRIPTS,
        env=endpoint.env(),
        capture_output=True,
        text=True,
        timeout=RUN,
        check=False,
    )
    assert done.returncode == 0, (
        f"{script} {args} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    )
    return done.stdout.splitlines()


def _bodies(numbers: range) -> list[str]:
    return [f"message {n}" for n in numbers]


@pytest.mark.parametrize("space", [BROKERED, STANDARD])
def test_send_then_receive(endpoints: dict[str, Endpoint], space: str) -> None:
    endpoint = endpoints[space]
    assert node(endpoint, "send.mjs", "orders", "20") == ["accepted 20 of 20"]
    assert node(endpoint, "receive.mjs", "orders", "20") == _bodies(range(1, 21))


@pytest.mark.parametrize("space", [BROKERED, STANDARD])
def test_request_response_through_a_dynamic_reply_address(
    endpoints: dict[str, Endpoint], space: str
) -> None:
    """The server answers on an anonymous-relay link, each reply to the request's reply-to:
    the dynamic address the client's receiver was given."""
    endpoint = endpoints[space]
    server = subprocess.Popen(
        ["node", str(SCRIPTS / "server.mjs"), "requests", str(len(REQUESTS))],
        cwd=SCRIPTS,
        env=endpoint.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready"  # its receiver is attached
        answers = node(endpoint, "client.mjs", "requests", *REQUESTS)
        assert answers == [f"{request} => {request.upper()}" for request in REQUESTS]
        output, _ = server.communicate(timeout=RUN)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)
    assert server.returncode == 0, output
    assert output.splitlines() == [f"answered {n}" for n in range(1, len(REQUESTS) + 1)]


def test_a_selector_takes_its_half(endpoints: dict[str, Endpoint]) -> None:
    """On the brokered space's queue: the selector's receiver gets the green (odd) messages;
    the red ones stay for a receiver without one."""
    endpoint = endpoints[BROKERED]
    assert node(endpoint, "send.mjs", "colours", "20") == ["accepted 20 of 20"]
    greens = node(endpoint, "receive.mjs", "colours", "10", "colour = 'green'")
    assert greens == _bodies(range(1, 21, 2))
    assert node(endpoint, "receive.mjs", "colours", "10") == _bodies(range(2, 21, 2))
