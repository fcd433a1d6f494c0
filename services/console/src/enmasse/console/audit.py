"""The console's audit trail: one structured event per admin write it makes itself.

Most of what the console writes goes through the config service, which audits it there. A Close
of a client's connection, or of one of its links, does not: the console makes it on a router
(RouterAdmin, with the operator's certificate) once the admin API has let the user's token write
in the space. So the console logs that write here, as the config service logs its own
(`enmasse.config.audit`): one event `audit` (logger `enmasse.console.audit`) with who (the
token's fingerprint, connections.token_fingerprint; the config service's audit of the same
moment's permission check names the token), what (`rpc`, `kind`), where (`space`, `name`:
`<router>/<connection id>`, and `/<role> <link name>` for a link), the outcome (`ok`, or
`refused` and why in `reason`) and the browser's address (`peer`).

No rate limit of its own: every event follows a POST the admin API has just accepted for that
token (a refused one is audited by the config service, and rate-limited there).
"""

from __future__ import annotations

import structlog

log = structlog.get_logger("enmasse.console.audit")

OK = "ok"
REFUSED = "refused"


KINDS = {"CloseConnection": "Connection", "CloseLink": "Link"}


def record_close(
    *, who: str, rpc: str, space: str, name: str, outcome: str, reason: str = "", peer: str = ""
) -> None:
    """`rpc`: CloseConnection (`name`: `<router>/<id>`) or CloseLink (`<router>/<id>/<role>
    <link name>`)."""
    log.info(
        "audit",
        who=who,
        rpc=rpc,
        kind=KINDS[rpc],
        space=space,
        name=name,
        outcome=outcome,
        reason=reason,
        peer=peer,
    )
