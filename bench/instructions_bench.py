"""Instructions per message: the one figure on this machine that does not move with its load.

What flows in: 20,000 acked 100-byte messages (`--quick`: 5,000), from the harness's own producer
and consumer processes, through one peer at a time (the bare engine forwarder, one router, one
broker with a non-persistent queue) started under `valgrind --tool=callgrind`. What flows out: a
table of the peer's user-space instructions per message, and the share spent releasing and
taking back the GIL (`PyEval_SaveThread` + `PyEval_RestoreThread`): around every cffi call into
proton before the engine's per-message calls moved to `enmasse.amqp_hotpath`, around socket
reads and writes and the remaining cold-path cffi calls since.

Why: msgs/s and CPU µs per message on this shared 2-core machine swing by half from one hour to
the next (the same RabbitMQ node measured 145 and 218 µs/msg on the same afternoon), which
drowns any change of a few percent. Callgrind counts instructions, which depend only on the code
and its input: each peer runs twice, with no messages and with N, and the difference divided by
N is its cost per message, start-up excluded. Under callgrind a peer runs about 50 times slower,
so its clients always keep it busy and batches are large: the figure is the per-message work of
a peer at full load. Cache misses and system calls are not in it; read it beside the msgs/s
suites, not instead of them.

`python -m bench instructions [--quick] [--record]`; needs Debian's `valgrind`.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.harness import Context, Table, suite, throughput
from tests.fixtures.broker import BrokerProcess
from tests.fixtures.router import RouterFleet

GIL_HAND_OFF = ("PyEval_SaveThread", "PyEval_RestoreThread")
COLUMNS = ["peer", "messages", "instructions per message", "of which GIL hand-offs", "errors"]
START_TIMEOUT = 600.0

# A peer started under callgrind: yields (AMQP port, address to use).
Peer = Callable[[tuple[str, ...]], contextlib.AbstractContextManager[tuple[int, str]]]


def _callgrind(out: Path) -> tuple[str, ...]:
    return ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}")


@contextlib.contextmanager
def _forwarder(wrapper: tuple[str, ...]) -> Iterator[tuple[int, str]]:
    with tempfile.TemporaryDirectory(prefix="bench-cg-fwd-") as tmp:
        port_file = Path(tmp) / "port"
        code = f"import bench.forwarder as f; f.serve_with_port_file({str(port_file)!r})"
        command = [*wrapper, sys.executable, "-c", code]
        process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not port_file.exists() and time.monotonic() < deadline and process.poll() is None:
                time.sleep(0.2)
            yield int(port_file.read_text()), "fwd"
        finally:
            process.terminate()
            process.wait(120)


@contextlib.contextmanager
def _router(wrapper: tuple[str, ...]) -> Iterator[tuple[int, str]]:
    with tempfile.TemporaryDirectory(prefix="bench-cg-router-") as tmp:
        fleet = RouterFleet(workdir=Path(tmp))
        try:
            router = fleet.start("r1", wrapper=wrapper, start_timeout=START_TIMEOUT)
            router.apply(fleet.mesh_config(generation=1, addresses={"cg": "anycast"}))
            yield router.amqp_port, "cg"
        finally:
            fleet.stop_all()


@contextlib.contextmanager
def _broker(wrapper: tuple[str, ...]) -> Iterator[tuple[int, str]]:
    with tempfile.TemporaryDirectory(prefix="bench-cg-broker-") as tmp:
        broker = BrokerProcess(workdir=Path(tmp), wrapper=wrapper)
        broker.start(timeout=START_TIMEOUT)
        try:
            broker.ensure_queue("cg", persistent=False)
            yield broker.amqp_port, "cg"
        finally:
            broker.stop()


def _run(peer: Peer, *, messages: int, out: Path) -> list[str]:
    """One peer under callgrind, `messages` through it; the errors seen (none: a clean run)."""
    with peer(_callgrind(out)) as (port, address):
        if not messages:
            return []
        result = throughput(
            host="127.0.0.1", port=port, address=address, messages=messages, time_limit=900.0
        )
        return result.errors if result.received == messages else [*result.errors, "lost"]


def _totals(out: Path) -> tuple[int, int]:
    """(all instructions, instructions inside the GIL hand-off) of one callgrind output.

    Callgrind names a function once, `cfn=(id) name`, then by id alone; a call site is
    `cfn=...`, `calls=N ...`, then a line ending in the call's inclusive cost.
    """
    total = 0
    gil = 0
    names: dict[str, str] = {}
    callee = ""
    after_calls = False
    for line in out.read_text().splitlines():
        if line.startswith("summary:"):
            total = int(line.split()[1])
        elif line.startswith(("fn=(", "cfn=(", "cfi=(", "cfl=(", "fl=(", "fi=(", "fe=(")):
            ident, _, name = line.partition("=")[2].partition(" ")
            if line.startswith(("fn=", "cfn=")) and name:
                names[ident] = name
            if line.startswith("cfn="):
                callee = names.get(ident, "")
        elif line.startswith("calls="):
            after_calls = True
        elif after_calls:
            after_calls = False
            if callee in GIL_HAND_OFF:
                gil += int(line.split()[-1])
    return total, gil


@suite("instructions", "instructions per message of forwarder, router and broker (callgrind)")
def instructions_suite(ctx: Context) -> Iterator[Table]:
    table = Table("Instructions per acked 100 B message, under callgrind", COLUMNS)
    if shutil.which("valgrind") is None:
        table.add("-", 0, "-", "-", "valgrind is not installed (apt-get install valgrind)")
        yield table
        return
    messages = ctx.messages(20_000) if not ctx.quick else 5_000
    for name, peer in (("forwarder", _forwarder), ("router", _router), ("broker", _broker)):
        with tempfile.TemporaryDirectory(prefix="bench-cg-") as tmp:
            idle, busy = Path(tmp) / "idle.out", Path(tmp) / "busy.out"
            _run(peer, messages=0, out=idle)
            errors = _run(peer, messages=messages, out=busy)
            (idle_total, idle_gil), (busy_total, busy_gil) = _totals(idle), _totals(busy)
        per_message = (busy_total - idle_total) / messages
        gil_share = (busy_gil - idle_gil) / max(busy_total - idle_total, 1)
        table.add(name, messages, round(per_message), f"{gil_share:.0%}", "; ".join(errors) or "-")
    yield table
