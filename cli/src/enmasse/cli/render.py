"""Resources -> what `get`, `status` and `watch` print: kubectl-like tables, YAML, JSON.

`table_rows` is pure (headers and string cells per kind) so tests can check the columns without a
terminal; `print_table` hands them to rich. Empty cells print as `-` so that every row splits into
the same number of words (people pipe these tables into awk).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from enmasse.resources.manifests import KindInfo, dump_json, dump_yaml, inner
from enmasse.v1 import resources_pb2
from rich.console import Console
from rich.table import Table

HEADERS: dict[str, tuple[str, ...]] = {
    "AddressSpacePlan": ("NAME", "TYPE", "ADDRESS-PLANS", "MAX-ADDRESSES"),
    "AddressPlan": ("NAME", "ADDRESS-TYPE", "BROKER", "PERSISTENT"),
    "AddressSpace": ("NAME", "TYPE", "PLAN", "PHASE"),
    "Address": ("SPACE", "NAME", "ADDRESS", "TYPE", "PLAN", "PHASE"),
    "MessagingUser": ("SPACE", "NAME", "USERNAME"),
}


def _cell(value: object) -> str:
    text = str(value)
    return text if text else "-"


def _row(kind: str, message: Any) -> tuple[str, ...]:
    meta, spec = message.metadata, message.spec
    if kind == "AddressSpacePlan":
        quota = spec.quotas.max_addresses or "unlimited"
        return (meta.name, spec.address_space_type, ",".join(spec.address_plans), str(quota))
    if kind == "AddressPlan":
        persistent = "yes" if spec.persistent else "no"
        return (meta.name, spec.address_type, f"{spec.broker:g}", persistent)
    if kind == "AddressSpace":
        return (meta.name, spec.type, spec.plan, message.status.status.phase)
    if kind == "Address":
        phase = message.status.status.phase
        return (meta.space, meta.name, spec.address, spec.type, spec.plan, phase)
    return (meta.space, meta.name, spec.username)


def table_rows(
    info: KindInfo, resources: Sequence[resources_pb2.Resource]
) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    rows = [tuple(_cell(c) for c in _row(info.name, inner(r))) for r in resources]
    return HEADERS[info.name], rows


def make_console() -> Console:
    console = Console()
    # Piped output (scripts, tests) must not be cut at 80 columns.
    return console if console.is_terminal else Console(width=1000)


def print_table(console: Console, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for header in headers:
        table.add_column(header, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    if console.is_terminal:
        console.print(table)
        return
    with console.capture() as captured:
        console.print(table)
    for line in captured.get().splitlines():  # rich pads the last column; pipes need no tail
        console.out(line.rstrip(), highlight=False)


def print_resources(
    console: Console,
    *,
    info: KindInfo,
    resources: Sequence[resources_pb2.Resource],
    output: str,
    single: bool,
) -> None:
    if output == "yaml":
        console.out(dump_yaml(resources).rstrip("\n"), highlight=False)
    elif output == "json":
        console.out(dump_json(resources, single=single), highlight=False)
    elif not resources:
        console.out(f"No {info.plural} found.", highlight=False)
    else:
        print_table(console, *table_rows(info, resources))
