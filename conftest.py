"""Shared pytest fixtures for the whole tree, as plugins: one module per expensive thing.

Each module under tests/fixtures/ starts a real process (etcd, the config service, a broker, a
router) on free loopback ports in a temp dir, and stops what it started, by PID. Session-scoped
where a thing is expensive and safe to share; tests that need a clean one ask for the
function-scoped variant.
"""

pytest_plugins: list[str] = [
    "tests.fixtures.etcd",
    "tests.fixtures.config_service",
    "tests.fixtures.amqp",
    "tests.fixtures.broker",
    "tests.fixtures.router",
    "tests.fixtures.spark",
    "tests.fixtures.local_runtime",
]
