"""Interop: Apache Qpid Proton's own Python examples against a brokered space (issue #16).

The examples are the ones Debian ships in `libqpid-proton11-dev-examples` (Proton 0.37, under
/usr/share/proton/examples/python; `scripts/setup` installs the package), run unchanged but for
where they connect: each is copied into a temp dir with `localhost:5672` (their default, written
into several of them) replaced by the space's endpoint from its status with a MessagingUser's
name and password in the URL, as a user would point them at it. They run on our Python (which
has python-qpid-proton 0.40, locked in uv.lock) as subprocesses, each bounded in time, and what
is asserted is their own output, as Proton's `test_examples.py` asserts it, plus what is left
in the queue where that matters.

The space: `interop-proton`, plan brokered-single (no ANONYMOUS, no PLAIN without TLS: the
examples log in with SCRAM through Proton's Cyrus SASL), one broker, queues for the examples
and a user with every right. On the session's `enmasse up` stack (`local_runtime`).

Which examples, and why the others are not run (`test_every_example_is_accounted_for` keeps
the list honest against the package):
- run: helloworld, helloworld_blocking, simple_send/simple_recv, client/server,
  sync_client/server (request-response through a dynamic reply queue, the replies sent on an
  anonymous-relay link), client/abstract_server, colour_send/selected_recv (a JMS selector),
  queue_browser (a `copy` source: browsing), db_send/db_recv (sqlite3 only), and the
  transactional ones: tx_send/tx_recv, tx_recv_interactive, client/server_tx;
- peer to peer (no broker in between): helloworld_direct, direct_send, direct_recv,
  server_direct;
- tornado (not installed; the issue leaves them out): helloworld_tornado,
  helloworld_direct_tornado, recurring_timer_tornado, client_http, proton_tornado;
- not a client of a space: broker.py (a broker of its own), recurring_timer (no connection);
- helpers of the others: colour_send, db_common, db_ctrl, proton_server, test_examples.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.fixtures.local_runtime import LocalRuntime

pytestmark = pytest.mark.slow

EXAMPLES = Path("/usr/share/proton/examples/python")
PACKAGE = "libqpid-proton11-dev-examples"
SPACE, USER, PASSWORD = "interop-proton", "proton", "examples-pw"
QUEUES = ("examples", "requests", "numbers", "colours", "records", "tx")
RUN = 60.0  # seconds an example may take before it counts as hung
# Their prints reach us as they happen (a pipe would hold them until the example ends).
UNBUFFERED = {**os.environ, "PYTHONUNBUFFERED": "1"}

MANIFESTS = f"""
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {{name: {SPACE}}}
spec: {{type: brokered, plan: brokered-single}}
---
apiVersion: enmasse.io/v1
kind: MessagingUser
metadata: {{name: {USER}, space: {SPACE}}}
spec:
  username: {USER}
  password: {PASSWORD}
  authorization: [{{addresses: ["#"], operations: [send, recv]}}]
""" + "".join(
    f"""---
apiVersion: enmasse.io/v1
kind: Address
metadata: {{name: {queue}, space: {SPACE}}}
spec: {{address: {queue}, type: queue, plan: brokered-queue}}
"""
    for queue in QUEUES
)

RUN_HERE = {
    "helloworld.py",
    "helloworld_blocking.py",
    "simple_send.py",
    "simple_recv.py",
    "client.py",
    "server.py",
    "sync_client.py",
    "abstract_server.py",
    "selected_recv.py",
    "queue_browser.py",
    "db_send.py",
    "db_recv.py",
    "tx_send.py",
    "tx_recv.py",
    "tx_recv_interactive.py",
    "server_tx.py",
}
PEER_TO_PEER = {"helloworld_direct.py", "direct_send.py", "direct_recv.py", "server_direct.py"}
TORNADO = {
    "helloworld_tornado.py",
    "helloworld_direct_tornado.py",
    "recurring_timer_tornado.py",
    "client_http.py",
    "proton_tornado.py",
}
NOT_A_CLIENT = {"broker.py", "recurring_timer.py"}
HELPERS = {"colour_send.py", "db_common.py", "db_ctrl.py", "proton_server.py", "test_examples.py"}

REQUESTS = [
    "Twas brillig, and the slithy toves",
    "Did gire and gymble in the wabe.",
    "All mimsy were the borogroves,",
    "And the mome raths outgrabe.",
]
ANSWERS = [f"{line} => {line.upper()}" for line in REQUESTS]


@pytest.fixture(scope="module")
def endpoint(local_runtime: LocalRuntime) -> str:
    """The space's endpoint as the examples take it: user:password@host:port."""
    if not EXAMPLES.is_dir():
        pytest.skip(f"Qpid Proton's examples are not installed: apt-get install {PACKAGE}")
    local_runtime.apply(MANIFESTS, name="interop-proton.yaml")
    local_runtime.wait_active(SPACE, list(QUEUES))
    return f"{USER}:{PASSWORD}@127.0.0.1:{local_runtime.router_port(SPACE)}"


@pytest.fixture(scope="module")
def examples(endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The examples, copied with their default `localhost:5672` pointing at the space."""
    here = tmp_path_factory.mktemp("proton-examples")
    for source in EXAMPLES.glob("*.py"):
        text = source.read_text().replace("localhost:5672", endpoint)
        (here / source.name).write_text(text)
    return here


def _command(examples: Path, script: str, *args: str) -> list[str]:
    return [sys.executable, str(examples / script), *args]


def run(
    examples: Path, script: str, *args: str, stdin: str | None = None, timeout: float = RUN
) -> list[str]:
    """Runs one example to its end; its output lines. A hang fails the test, as does an exit
    other than 0."""
    done = subprocess.run(
        _command(examples, script, *args),
        cwd=examples,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=UNBUFFERED,
    )
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stderr}"
    return [line.strip() for line in done.stdout.splitlines()]


@contextlib.contextmanager
def running(
    examples: Path, script: str, *args: str, stdin: bool = False
) -> Iterator[subprocess.Popen[str]]:
    """An example that runs until stopped (a server), stopped by its PID at the end."""
    process = subprocess.Popen(
        _command(examples, script, *args),
        cwd=examples,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=UNBUFFERED,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.communicate(timeout=10)
        except (subprocess.TimeoutExpired, ValueError):  # ValueError: a Prompt read it already
            process.kill()
            process.wait(timeout=10)


class Prompt:
    """Talks to an interactive example: a line in, then wait (bounded) for a line out."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self.process = process
        self.seen: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(process.stdout,), daemon=True).start()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            self._lines.put(line.strip())
        self._lines.put(None)  # the example ended

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def end(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()

    def expect(self, wanted: str, timeout: float = RUN) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {wanted!r} within {timeout}s: {self.seen}") from None
            if line is None:
                raise AssertionError(f"ended before {wanted!r}: {self.seen}")
            self.seen.append(line)
            if line == wanted:
                return


def _at(endpoint: str, queue: str) -> str:
    return f"{endpoint}/{queue}"


def _sequence(count: int) -> list[str]:
    return [f"{{'sequence': {n}}}" for n in range(1, count + 1)]


def test_every_example_is_accounted_for() -> None:
    """Each example the package ships is run here or left out for a reason in the docstring."""
    if not EXAMPLES.is_dir():
        pytest.skip(f"Qpid Proton's examples are not installed: apt-get install {PACKAGE}")
    shipped = {p.name for p in EXAMPLES.glob("*.py")}
    accounted = RUN_HERE | PEER_TO_PEER | TORNADO | NOT_A_CLIENT | HELPERS
    assert shipped - accounted == set(), "a new example: run it or say why not"


@pytest.mark.parametrize("example", sorted(PEER_TO_PEER))
def test_peer_to_peer_examples(example: str) -> None:
    pytest.skip(f"{example} is peer to peer: it listens itself, no space in between")


def test_helloworld(examples: Path) -> None:
    assert run(examples, "helloworld.py") == ["Hello World!"]


def test_helloworld_blocking(examples: Path) -> None:
    assert run(examples, "helloworld_blocking.py") == ["Hello World!"]


def test_simple_send_and_simple_recv(examples: Path, endpoint: str) -> None:
    address = _at(endpoint, "numbers")
    assert run(examples, "simple_send.py", "-a", address) == ["all messages confirmed"]
    assert run(examples, "simple_recv.py", "-a", address) == _sequence(100)


def test_simple_recv_waits_for_simple_send(examples: Path, endpoint: str) -> None:
    """The receiver first, as in Proton's test_examples: it gets all 100 as they come."""
    address = _at(endpoint, "numbers")
    with running(examples, "simple_recv.py", "-a", address) as receiver:
        assert run(examples, "simple_send.py", "-a", address) == ["all messages confirmed"]
        output, _ = receiver.communicate(timeout=RUN)
    assert receiver.returncode == 0, output
    assert [line.strip() for line in output.splitlines()] == _sequence(100)


@pytest.mark.parametrize(
    ("client", "server"),
    [
        pytest.param("client.py", "server.py", id="client-server"),
        pytest.param("sync_client.py", "server.py", id="sync_client-server"),
        pytest.param("client.py", "abstract_server.py", id="client-abstract_server"),
    ],
)
def test_request_response(examples: Path, endpoint: str, client: str, server: str) -> None:
    """The client asks through a dynamic reply queue; the server answers on an anonymous-relay
    link, each reply addressed by its `to` (the request's reply-to)."""
    queue = "examples" if server == "abstract_server.py" else "requests"
    address = _at(endpoint, queue)
    server_args = () if server == "abstract_server.py" else ("-a", address)
    with running(examples, server, *server_args):
        assert run(examples, client, "-a", address) == ANSWERS


def test_selected_recv(examples: Path, endpoint: str) -> None:
    """A JMS selector (`colour = 'green'`) takes the green half; the red half stays for a
    receiver without one."""
    address = _at(endpoint, "colours")
    assert run(examples, "colour_send.py", "-a", address) == ["all messages confirmed"]
    greens = [f"green {n}" for n in range(1, 101, 2)]
    reds = [f"red {n}" for n in range(2, 101, 2)]
    assert run(examples, "selected_recv.py", "-a", address, "-m", "50") == greens
    assert run(examples, "simple_recv.py", "-a", address, "-m", "50") == reds


def test_queue_browser(examples: Path, endpoint: str) -> None:
    """A `copy` source: the browser sees the messages, which stay in the queue."""
    address = _at(endpoint, "examples")
    assert run(examples, "simple_send.py", "-a", address, "-m", "10") == ["all messages confirmed"]
    browsed = run(examples, "queue_browser.py")
    assert browsed, "the browser saw nothing"
    for n, line in enumerate(browsed, start=1):  # it stops once it has nothing buffered
        assert line.startswith("Message("), line
        assert f"'sequence': {n}}}" in line, line
    assert run(examples, "simple_recv.py", "-a", address, "-m", "10") == _sequence(10)


def test_db_send_and_db_recv(examples: Path, endpoint: str) -> None:
    """Rows of one sqlite database become messages, and rows of another."""
    for database in ("src_db", "dst_db"):
        run(examples, "db_ctrl.py", "init", f"./{database}")
    rows = "".join(f"Message-{n}\n" for n in range(1, 101))
    run(examples, "db_ctrl.py", "insert", "./src_db", stdin=rows)
    address = _at(endpoint, "records")
    with running(examples, "db_recv.py", "-a", address, "-m", "100") as receiver:
        run(examples, "db_send.py", "-a", address, "-m", "100")
        output, _ = receiver.communicate(timeout=RUN)
    assert receiver.returncode == 0, output
    inserted = [line.strip() for line in output.splitlines()]
    assert inserted == [f"inserted message {n}" for n in range(1, 101)]
    listed = run(examples, "db_ctrl.py", "list", "./dst_db")
    assert listed == [f"({n}, 'Message-{n}')" for n in range(1, 101)]


# ------------------------------------------------------------------ transactions (last: an
# unfinished one may leave messages behind in its queue)


def test_tx_send_and_tx_recv(examples: Path, endpoint: str) -> None:
    address = _at(endpoint, "tx")
    assert run(examples, "tx_send.py", "-a", address) == ["all messages committed"]
    assert run(examples, "tx_recv.py", "-a", address) == _sequence(100)


def test_tx_recv_interactive(examples: Path, endpoint: str) -> None:
    """Typed at it as a user would, each command once the last one's answer is printed: fetch
    two, abort (they go back), fetch the same two again, commit (gone)."""
    sent = run(examples, "simple_send.py", "-a", _at(endpoint, "examples"), "-m", "2")
    assert sent == ["all messages confirmed"]
    with running(examples, "tx_recv_interactive.py", stdin=True) as process:
        prompt = Prompt(process)
        prompt.expect("transaction declared")
        for command, answers in (
            ("fetch", ["{'sequence': 1}"]),
            ("fetch", ["{'sequence': 2}"]),
            ("abort", ["transaction aborted", "transaction declared"]),
            ("fetch", ["{'sequence': 1}"]),
            ("fetch", ["{'sequence': 2}"]),
            ("commit", ["transaction committed", "transaction declared"]),
        ):
            prompt.send(command)
            for answer in answers:
                prompt.expect(answer)
        prompt.send("quit")
        prompt.end()  # it reads commands until its input ends
        assert process.wait(timeout=RUN) == 0
    assert prompt.seen[0] == "Enter 'fetch', 'commit' or 'abort'"


def test_request_response_with_a_transactional_server(examples: Path, endpoint: str) -> None:
    """server_tx answers in a transaction: the reply sent and the request accepted together,
    on the anonymous relay it finds offered in the broker's open frame."""
    with running(examples, "server_tx.py"):
        assert run(examples, "client.py", "-a", _at(endpoint, "examples")) == ANSWERS
