"""The edge of every ConfigService call: who calls (tokens), may they (access), and the audit.

In: the call's context (its metadata and peer) and what the call is about (`Call`: the RPC, the
address space, the kind and name). Out: the caller's `Identity`, or `Refused` with
UNAUTHENTICATED (no, unknown, expired or revoked token) or PERMISSION_DENIED (the role does not
allow it: the message names the space); every refusal, and every write's outcome, as an audit
event (`enmasse.config.audit`).

Without an authenticator (config started without --auth) every caller is `access.OPEN`: allowed
everything, as before there were tokens; the writes are still audited.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from enmasse.config.access import (
    APPLY,
    OPEN,
    OPERATIONS,
    STATUS,
    WRITE,
    Identity,
    authorize,
)
from enmasse.config.audit import OK, AuditEvent, AuditLog
from enmasse.config.tokens import Authenticator
from enmasse.config.writes import Refused

_WRITE_VERBS = (WRITE, STATUS, APPLY)
_TOKEN_WRITES = ("CreateToken", "RevokeToken")
UNAUTHENTICATED_WHO = "unauthenticated"


@dataclass(frozen=True)
class Call:
    """What one call is about: the RPC, and where (space, kind, name) for the audit."""

    rpc: str
    space: str = ""
    kind: str = ""
    name: str = ""

    @property
    def writes(self) -> bool:
        operation = OPERATIONS.get(self.rpc)
        return self.rpc in _TOKEN_WRITES or (
            operation is not None and operation.verb in _WRITE_VERBS
        )


class Gate:
    def __init__(self, *, authenticator: Authenticator | None, audit: AuditLog) -> None:
        self.authenticator = authenticator
        self.audit = audit

    @property
    def enforcing(self) -> bool:
        return self.authenticator is not None

    async def admit(self, context: grpc.aio.ServicerContext, call: Call) -> Identity:
        """The caller, if it may make `call`; else Refused (and audited)."""
        identity = await self.identify(context, call)
        self.check(identity, call, peer=context.peer())
        return identity

    async def identify(self, context: grpc.aio.ServicerContext, call: Call) -> Identity:
        if self.authenticator is None:
            return OPEN
        try:
            return await self.authenticator.identify(context.invocation_metadata() or ())
        except Refused as refused:
            self._record(
                None, call, outcome=refused.code.name, reason=refused.message, peer=context.peer()
            )
            raise

    def check(self, identity: Identity, call: Call, *, peer: str = "") -> None:
        """Refused (PERMISSION_DENIED, audited) unless `identity` may make `call`."""
        decision = authorize(identity, call.rpc, call.space)
        if decision.allowed:
            return
        refused = Refused(grpc.StatusCode.PERMISSION_DENIED, decision.reason)
        self._record(identity, call, outcome=refused.code.name, reason=refused.message, peer=peer)
        raise refused

    def wrote(
        self, identity: Identity, call: Call, *, outcome: str = OK, reason: str = "", peer: str = ""
    ) -> None:
        """The audit event of a write that was let through the edge, with how it ended."""
        self._record(identity, call, outcome=outcome, reason=reason, peer=peer)

    def _record(
        self, identity: Identity | None, call: Call, *, outcome: str, reason: str, peer: str
    ) -> None:
        self.audit.record(
            AuditEvent(
                who=identity.name if identity is not None else UNAUTHENTICATED_WHO,
                role=identity.role if identity is not None else "",
                rpc=call.rpc,
                kind=call.kind,
                space=call.space,
                name=call.name,
                outcome=outcome,
                reason=reason,
                peer=peer,
            )
        )
