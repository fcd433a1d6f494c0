"""A space's MessagingUsers as its client endpoints check them: the routers of a standard space,
the broker of a brokered one.

What flows in, on the pushing side: the MessagingUser resources a controller reads with their
secrets (the scrypt hash and salted SCRAM keys the config service derived; never a password).
What flows out of it: `endpoint_users`, one `router_pb2.RouterUser` per user that can log in
(the router-agent puts them in every RouterConfig, the storage-controller in a brokered broker's
ClientAccess: one message for both). What flows in at the endpoint: those RouterUsers as pushed;
what flows out: `ClientUsers` (username -> hash, -> authorization rules, -> SCRAM keys by
mechanism), validated as a whole, or a `UserError` whose text names the user and what is wrong
(`user 'alice': rule 1: 'a..b' has an empty segment`): a push is taken whole or refused.

Why here: two controllers push users and two kinds of endpoint check them; the contract between
the four lives once. The rules are checked with `authorization.pattern_problem`, the check the
config service validates a MessagingUser with, so an endpoint never runs a rule the store would
have refused, and `enmasse.resources.permissions` matches them the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from enmasse.common.passwords import SCRAM_ITERATIONS, SCRAM_MECHANISMS, ScramKeys, is_password_hash
from enmasse.resources import contracts
from enmasse.resources.authorization import Rule, pattern_problem
from enmasse.v1 import resources_pb2, router_pb2

_KEY_SIZES = {"SCRAM-SHA-256": 32, "SCRAM-SHA-512": 64}


class UserError(ValueError):
    """Pushed users that do not hold together; the message names the user and the problem."""


@dataclass(frozen=True)
class ClientUsers:
    """The users an endpoint checks logins and attaches against (the hashes and keys are as
    secret as passwords: they never leave the endpoint again)."""

    hashes: dict[str, str] = field(default_factory=dict)  # username -> stored scrypt hash
    rules: dict[str, tuple[Rule, ...]] = field(default_factory=dict)  # username -> its rules
    scram: dict[str, dict[str, ScramKeys]] = field(default_factory=dict)  # -> mechanism -> keys


def endpoint_users(
    users: Iterable[resources_pb2.MessagingUser],
) -> tuple[router_pb2.RouterUser, ...]:
    """The space's users as endpoints check them, by username, each with its authorization rules
    as the MessagingUser says them; a user without a stored hash (none yet) cannot log in and is
    left out."""
    return tuple(
        router_pb2.RouterUser(
            username=u.spec.username,
            password_hash=u.spec.password_hash,
            scram_credentials=u.spec.scram_credentials,
            authorization=[
                router_pb2.RouterRule(addresses=rule.addresses, operations=rule.operations)
                for rule in u.spec.authorization
            ],
        )
        for u in sorted(users, key=lambda u: u.spec.username)
        if u.spec.username and u.spec.password_hash
    )


def client_users_from_proto(users: Sequence[router_pb2.RouterUser]) -> ClientUsers:
    """Validates pushed users as a whole (names and hashes first, then each user's rules, then
    its SCRAM keys); raises UserError naming the first problem."""
    hashes = _hashes(users)
    rules = {user.username: _rules(user) for user in users}
    scram = {user.username: _scram(user) for user in users}
    return ClientUsers(hashes=hashes, rules=rules, scram=scram)


def _hashes(users: Iterable[router_pb2.RouterUser]) -> dict[str, str]:
    found: dict[str, str] = {}
    for user in users:
        if not user.username:
            raise UserError("a user has an empty username")
        if user.username in found:
            raise UserError(f"user '{user.username}' is listed twice")
        if not is_password_hash(user.password_hash):
            raise UserError(
                f"user '{user.username}' has no usable password hash "
                "(expected scrypt$<n>$<r>$<p>$<salt>$<hash>)"
            )
        found[user.username] = user.password_hash
    return found


def _rules(user: router_pb2.RouterUser) -> tuple[Rule, ...]:
    """A user's rules, each with at least one valid pattern and one known operation."""
    rules = []
    for number, rule in enumerate(user.authorization, start=1):
        where = f"user '{user.username}': rule {number}"
        if not rule.addresses:
            raise UserError(f"{where} names no address")
        for pattern in rule.addresses:
            if problem := pattern_problem(pattern):
                raise UserError(f"{where}: {problem}")
        if not rule.operations:
            raise UserError(f"{where} names no operation")
        for operation in rule.operations:
            if operation not in contracts.OPERATIONS:
                raise UserError(
                    f"{where}: '{operation}' is not an operation "
                    f"(one of {', '.join(contracts.OPERATIONS)})"
                )
        rules.append(Rule(addresses=tuple(rule.addresses), operations=frozenset(rule.operations)))
    return tuple(rules)


def _scram(user: router_pb2.RouterUser) -> dict[str, ScramKeys]:
    """A user's SCRAM keys by mechanism: known mechanisms, enough iterations, keys of the
    mechanism's digest size, each mechanism once."""
    found: dict[str, ScramKeys] = {}
    for credential in user.scram_credentials:
        where = f"user '{user.username}': SCRAM credential {credential.mechanism!r}"
        if credential.mechanism not in SCRAM_MECHANISMS:
            raise UserError(f"{where}: not one of {', '.join(SCRAM_MECHANISMS)}")
        if credential.mechanism in found:
            raise UserError(f"{where} is listed twice")
        if credential.iterations < SCRAM_ITERATIONS:
            raise UserError(f"{where}: iterations must be >= {SCRAM_ITERATIONS}")
        size = _KEY_SIZES[credential.mechanism]
        keys = (credential.stored_key, credential.server_key)
        if not credential.salt or any(len(key) != size for key in keys):
            raise UserError(f"{where}: needs a salt and {size}-byte stored and server keys")
        found[credential.mechanism] = ScramKeys(
            mechanism=credential.mechanism,
            salt=credential.salt,
            iterations=credential.iterations,
            stored_key=credential.stored_key,
            server_key=credential.server_key,
        )
    return found
