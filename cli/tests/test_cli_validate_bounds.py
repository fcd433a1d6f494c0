"""`enmasse validate` offline on hostile manifests: bad address strings and a YAML bomb.

What a manifests repository's CI sees: one `file:line: message` per refusal, the very words the
config service answers with (the rule is `enmasse.resources.validation.address_problem`), and a
"billion laughs" refused at once instead of eating the runner's memory.
"""
# ruff: noqa: E501  (the exact lines read best on one line each)

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from enmasse.cli.main import cli

SPACE = """\
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {name: demo}
spec: {type: standard, plan: standard-small}
"""
RESERVED = "(reserved for the router network and the control plane)"

# (YAML scalar as written, the message after `spec.address: `)
BAD = [
    ('"a..b"', "'a..b' has an empty segment (segments are separated by '/' and '.')"),
    ('"a\\0b"', "'a\\x00b' must not contain control characters"),
    (
        '"a::b"',
        "'a::b' must not contain '::', which is reserved for subscriptions (<topic>::<name> on a broker)",
    ),
    ('"ordérs"', "'ord\\xe9rs' must hold ASCII characters only"),
    ('"_dynamic/x"', f"'_dynamic/x' must not start with '_dynamic/' {RESERVED}"),
    ('"_mesh/x"', f"'_mesh/x' must not start with '_mesh/' {RESERVED}"),
    ('"$x"', f"'$x' must not start with '$' {RESERVED}"),
    ("x" * 256, "must be at most 255 characters (got 256)"),
]


def address(name: str, scalar: str) -> str:
    return f"""\
apiVersion: enmasse.io/v1
kind: Address
metadata: {{name: {name}, space: demo}}
spec:
  address: {scalar}
  type: queue
  plan: standard-small-queue
"""


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def test_validate_refuses_each_bad_address_string_on_its_line(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text(SPACE)
    for index, (scalar, _) in enumerate(BAD):
        (tmp_path / f"bad-{index}.yaml").write_text(address(f"bad-{index}", scalar))
    (tmp_path / "good.yaml").write_text(address("good", "orders/eu.west"))
    code, out, err = run("validate", "-f", str(tmp_path))
    assert code == 1
    assert out.splitlines() == [
        f"{tmp_path}/bad-{index}.yaml:5: Address demo/bad-{index}: spec.address: {message}"
        for index, (_, message) in enumerate(BAD)
    ]
    assert err == f"{len(BAD)} error(s)\n"


def test_validate_refuses_a_billion_laughs_at_its_first_anchor(tmp_path: Path) -> None:
    lines = [
        "apiVersion: enmasse.io/v1",
        "kind: Address",
        "metadata: {name: lol, space: demo}",
        "spec:",
        '  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
    ]
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"  {name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    (tmp_path / "space.yaml").write_text(SPACE)
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    code, out, _err = run("validate", "-f", str(tmp_path))
    assert (code, out) == (
        1,
        f"{tmp_path}/bomb.yaml:5: YAML anchors and aliases are not allowed in manifests (&a)\n",
    )
