"""Idle benchmark (#18): what the local runtime costs when nothing happens.

What flows in: nothing but the options. The suite brings up the local runtime (`enmasse up` in a
temp var dir), creates 10 standard address spaces (3 with --quick) of one queue and one anycast
address each, waits until every address is Active, lets it settle, and then does nothing for 60 s
(20 s with --quick) while it reads the CPU time (utime + stime, /proc/<pid>/stat) of every program
supervisord runs, and of supervisord, at the start and the end of that window. Always `enmasse
down` after (then SIGKILL, by PID, whatever outlived it).

What flows out: one table, per program, the share of one core it used while idle. Target (#18):
under 1% of a core for every control-plane process and for the runtime. The load average is
printed beside it: the machine's other work does not change a process's own CPU seconds, but it is
the context a reader needs.

Run: `.venv/bin/python -m bench idle [--quick] [--record]`.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from enmasse.resources.paging import every_item
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from bench.harness import Context, Table, suite
from bench.provisioning_bench import address, admin_channel, local_runtime
from tests.fixtures.local_runtime import supervised

RPC_TIMEOUT = 30
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a live process, in seconds; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS


def create_spaces(stub: config_pb2_grpc.ConfigServiceStub, count: int) -> list[str]:
    names = [f"idle-{n}" for n in range(count)]
    for name in names:
        stub.CreateAddressSpace(
            resources_pb2.AddressSpace(
                metadata={"name": name}, spec={"type": "standard", "plan": "standard-small"}
            ),
            timeout=RPC_TIMEOUT,
        )
        for kind, plan in (("queue", "standard-small-queue"), ("anycast", "standard-anycast")):
            stub.CreateAddress(
                address(space=name, name=f"{kind}-a", kind=kind, plan=plan), timeout=RPC_TIMEOUT
            )
    return names


def wait_all_active(
    stub: config_pb2_grpc.ConfigServiceStub, spaces: list[str], *, limit: float
) -> float:
    started = time.monotonic()
    deadline = started + limit
    while time.monotonic() < deadline:
        if all(_all_active(stub, space) for space in spaces):
            return time.monotonic() - started
        time.sleep(1.0)
    waiting = [
        f"{space}/{a.metadata.name}: {a.status.status.phase} {list(a.status.status.messages)}"
        for space in spaces
        for a in every_item(
            partial(stub.ListAddresses, timeout=RPC_TIMEOUT), config_pb2.ListRequest(space=space)
        )
        if a.status.status.phase != "Active"
    ]
    raise RuntimeError(f"not every address Active within {limit:.0f} s: {waiting}")


def _all_active(stub: config_pb2_grpc.ConfigServiceStub, space: str) -> bool:
    """Every address of the space (ours and the ones the space comes with) Active."""
    listed = every_item(
        partial(stub.ListAddresses, timeout=RPC_TIMEOUT), config_pb2.ListRequest(space=space)
    )
    return len(listed) >= 2 and all(a.status.status.phase == "Active" for a in listed)


def program_cpu(var: Path) -> dict[str, tuple[int, float | None]]:
    return {
        name: (pid, cpu_seconds(pid) if pid else None)
        for name, (_state, pid) in supervised(var).items()
    }


@suite("idle", "local runtime with 10 spaces doing nothing: CPU of every process")
def idle_suite(ctx: Context) -> Iterator[Table]:
    spaces = 3 if ctx.quick else 10
    window = 20.0 if ctx.quick else 60.0
    with (
        tempfile.TemporaryDirectory(prefix="idle-bench-") as tmp,
        local_runtime(Path(tmp) / "var") as target,
        admin_channel(Path(tmp) / "var", target) as channel,
    ):
        var = Path(tmp) / "var"
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        names = create_spaces(stub, spaces)
        to_active = wait_all_active(stub, names, limit=300)
        stub.ListAddressSpaces(config_pb2.ListRequest(), timeout=RPC_TIMEOUT)
        time.sleep(10.0)  # what follows Active (statuses, first probes) is not idleness
        before = program_cpu(var)
        load_before = os.getloadavg()[0]
        time.sleep(window)
        after = program_cpu(var)
        load_after = os.getloadavg()[0]
    table = Table(
        title=f"Idle: {spaces} standard spaces (a queue and an anycast each), {window:.0f} s",
        columns=["program", "pid", "CPU % of one core"],
    )
    rows = []
    for name, (pid, end) in after.items():
        start = before.get(name, (0, None))[1]
        if end is None or start is None or before[name][0] != pid:
            rows.append((name, pid, "restarted or gone"))
            continue
        rows.append((name, pid, round(100 * (end - start) / window, 2)))
    for row in sorted(rows, key=lambda r: -r[2] if isinstance(r[2], float) else 0):
        table.add(*row)
    table.notes.append(
        f"All {2 * spaces} addresses Active {to_active:.0f} s after creation; load average "
        f"{load_before:.2f} at the start of the window, {load_after:.2f} at its end."
    )
    yield table
