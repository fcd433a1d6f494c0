"""Shared pytest fixtures for the whole tree, as plugins: one module per expensive thing.

Each module under tests/fixtures/ starts a real process (etcd, the config service, a broker, a
router) on free loopback ports in a temp dir, and stops what it started, by PID. Session-scoped
where a thing is expensive and safe to share; tests that need a clean one ask for the
function-scoped variant.
"""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins: list[str] = [
    "tests.fixtures.etcd",
    "tests.fixtures.config_service",
    "tests.fixtures.amqp",
    "tests.fixtures.broker",
    "tests.fixtures.router",
    "tests.fixtures.spark",
    "tests.fixtures.local_runtime",
]


@pytest.fixture(scope="session", autouse=True)
def enmasse_var(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every process the tests start inherits $ENMASSE_VAR, where services write their trace
    files: a session temp dir, so that a test run leaves nothing under the checkout's ./var."""
    folder = tmp_path_factory.mktemp("enmasse-var")
    previous = os.environ.get("ENMASSE_VAR")
    os.environ["ENMASSE_VAR"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("ENMASSE_VAR", None)
    else:
        os.environ["ENMASSE_VAR"] = previous
