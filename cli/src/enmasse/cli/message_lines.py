"""Messages in and out of the terminal for `send`, `receive` and `peek`: pure, no network.

In, for `send`: `-P KEY=VALUE` application properties (a value that reads as a JSON number,
`true`/`false` or `null` is that type, anything else a string: `-P count=3` sends the int 3,
`-P id='"3"'` the string "3"), and the bodies: `--body TEXT` `--count` times, or
`--body-file FILE` (`-` for stdin) whole, or one message per line with `--lines`.
Out, for `receive` and `peek`: a message as one JSON line (`-o json`), its body (text when it is
text, else base64 under `body_base64`), its header (durable, priority, ttl, delivery count),
properties and application properties, for `jq` and friends; or its body alone (`-o body`).
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from enmasse.amqp import codec
from enmasse.cli.client import CliError

STDIN = "-"


def parse_properties(pairs: Sequence[str]) -> dict[str, Any]:
    """`["region=eu", "count=3"]` -> {"region": "eu", "count": 3}; CliError on a pair
    without `=`."""
    properties: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--property {pair!r}: expected KEY=VALUE")
        properties[key] = _typed(text)
    return properties


def _typed(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, int | float | bool | str) or value is None else text


def bodies(*, body: str, count: int, body_file: str | None, lines: bool) -> list[str]:
    """What to send, one entry per message."""
    if body_file is None:
        if lines:
            raise CliError("--lines needs --body-file FILE (or - for stdin)")
        return [body] * count
    text = _read(body_file)
    if not lines:
        return [text] * count
    found = [line for line in text.splitlines() if line]
    if not found:
        raise CliError(f"no lines in {'stdin' if body_file == STDIN else body_file}")
    return found


def _read(body_file: str) -> str:
    if body_file == STDIN:
        return sys.stdin.read()
    try:
        return Path(body_file).read_text()
    except OSError as error:
        raise CliError(f"cannot read {body_file}: {error.strerror or error}") from None


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode(errors="replace")
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, int | float | bool | str) or value is None:
        return value
    return str(value)  # timestamps, symbols, uuids: as text


def as_json(payload: bytes) -> str:
    """One message as a JSON line (keys sorted within sections; empty sections left out)."""
    header = codec.read_header(payload)
    out: dict[str, Any] = {}
    body = codec.read_body(payload)
    if isinstance(body, bytes | bytearray):
        try:
            out["body"] = bytes(body).decode()
        except UnicodeDecodeError:
            out["body_base64"] = base64.b64encode(bytes(body)).decode()
    else:
        out["body"] = _plain(body)
    out["durable"] = header.durable
    out["priority"] = header.priority
    if header.ttl is not None:
        out["ttl"] = header.ttl
    out["delivery_count"] = header.delivery_count
    fields = {k: _plain(v) for k, v in codec.read_properties(payload)._asdict().items() if v}
    if fields:
        out["properties"] = fields
    application = codec.read_application_properties(payload)
    if application:
        out["application_properties"] = _plain(application)
    return json.dumps(out, sort_keys=False)
