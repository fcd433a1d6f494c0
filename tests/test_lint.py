"""The lint step of the suite: the checks `task lint` runs, so that CI holds the code to them too.

In: the working tree. Out: one test per tool, each failing with what the tool printed.

- `lint-imports` keeps the layer rules of `[tool.importlinter]` in pyproject.toml: services never
  import each other, libraries never import a service or the CLI, the CLI imports no service, the
  message plane (`enmasse.amqp`) and the resource model (`enmasse.resources`) stand apart on
  `enmasse.common`, and no package has an import circle (imports inside functions count too, so a
  circle cannot hide in one).
- `ruff` keeps the style rules, `mypy` the types, over every member.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SOURCES = [
    "libs/common/src",
    "libs/amqp/src",
    "libs/resources/src",
    "libs/amqp-hotpath/src",
    *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("services/*/src")),
    "cli/src",
    "analytics/src",
]


def _run(*command: str) -> None:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout}\n{done.stderr}"


def test_the_layer_rules_hold() -> None:
    _run(str(BIN / "lint-imports"), "--no-cache")


@pytest.mark.parametrize("check", [["check", "."], ["format", "--check", "."]])
def test_ruff_is_clean(check: list[str]) -> None:
    _run(str(BIN / "ruff"), *check)


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    _run(str(BIN / "mypy"), *SOURCES)
