"""Resources -> what `get`, `status` and `watch` print: kubectl-like tables, YAML, JSON, names.

`table_rows` is pure (headers and string cells per kind) so tests can check the columns without a
terminal; `print_table` hands them to rich. The columns of each kind are the kinds table's
(`enmasse.resources.kinds`, like a CRD's printer columns; its `wide` ones only for `-o wide`,
like kubectl's); here they are only formatted: lists
joined with commas, booleans as yes/no, numbers short. Empty cells print as `-` so that every row
splits into the same number of words (people pipe these tables into awk).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from enmasse.resources.kinds import Column, Kind, object_of
from enmasse.resources.manifests import dump_json, dump_yaml, to_manifest
from enmasse.v1 import resources_pb2
from rich.console import Console
from rich.table import Table


def _cell(value: Any, column: Column) -> str:
    """One value as the table shows it; empty cells print as `-`."""
    if isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, int):
        text = column.zero if column.zero and not value else str(value)
    elif isinstance(value, str):
        text = value
    else:  # a repeated field
        text = ",".join(str(item) for item in value)
    return text if text else "-"


def _field(message: Any, path: str) -> Any:
    value = message
    for part in path.split("."):
        value = getattr(value, part)
    return value


def table_rows(
    kind: Kind, resources: Sequence[resources_pb2.Resource], *, wide: bool = False
) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    columns = [column for column in kind.columns if wide or not column.wide]
    headers = tuple(column.header for column in columns)
    rows = [tuple(_cell(_field(object_of(r), c.path), c) for c in columns) for r in resources]
    return headers, rows


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


OUTPUTS = ("table", "wide", "yaml", "json", "name")


def name_of(info: Kind, resource: resources_pb2.Resource) -> str:
    """`address/orders`: what `-o name` prints, one a line, as kubectl does."""
    return f"{info.name.lower()}/{object_of(resource).metadata.name}"


def print_resources(
    console: Console,
    *,
    info: Kind,
    resources: Sequence[resources_pb2.Resource],
    output: str,
    single: bool,
) -> None:
    if output == "yaml":
        console.out(dump_yaml(resources).rstrip("\n"), highlight=False)
    elif output == "json":
        console.out(dump_json(resources, single=single), highlight=False)
    elif output == "name":
        for resource in resources:
            console.out(name_of(info, resource), highlight=False)
    elif not resources:
        console.out(f"No {info.plural} found.", highlight=False)
    else:
        print_table(console, *table_rows(info, resources, wide=output == "wide"))


def print_change(
    console: Console,
    *,
    info: Kind,
    resource: resources_pb2.Resource,
    output: str,
    deleted: bool = False,
) -> None:
    """One change `get --watch` saw: a table row (cells joined by three spaces: the listing's
    column widths are not known in advance), a YAML document, a JSON line, or a name."""
    if output == "yaml":
        console.out("---\n" + dump_yaml([resource]).rstrip("\n"), highlight=False)
    elif output == "json":
        console.out(json.dumps(to_manifest(resource)), highlight=False)
    elif output == "name":
        console.out(name_of(info, resource), highlight=False)
    else:
        _headers, rows = table_rows(info, [resource], wide=output == "wide")
        cells = list(rows[0]) + (["(deleted)"] if deleted else [])
        console.out("   ".join(cells), highlight=False)
