"""What a brokered space's broker must know of its clients, and whether to tell it again.

In: the space's name, its plan (the AddressSpacePlan: login policy and quotas) and its
MessagingUsers as the informer holds them (with their scrypt hashes and SCRAM keys: this
controller runs as `controller`, which may read them), and, per broker, the version of the access
it says it holds (`ListAddresses.client_access_version`). Out: `client_access`, the
`broker_pb2.ClientAccess` the space calls for now, named by a digest of its content (`version`),
and `access_to_push`: that message when the broker holds anything else (a broker that restarted
holds nothing), None when it holds it already.

Why so: a broker keeps its clients' access in memory only (it never reads the store), so the
controller must tell, cheaply and without remembering anything itself, whether a broker holds
what the space says now. The digest of the message's deterministic serialization is that name:
the same users, rules and plan give the same version in any pass of any controller process, and
the broker echoes it back. The users are the routers' (`enmasse.resources.client_access
.endpoint_users`: one contract for every client endpoint). The plan's quotas go to the broker as
they are: a brokered space has one broker, the whole of its client endpoint, so there is nothing
to share out as there is between a standard space's routers. Pure: the pass and its tests share it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from enmasse.resources.client_access import endpoint_users
from enmasse.resources.contracts import max_message_size
from enmasse.v1 import broker_pb2, resources_pb2, router_pb2


def client_access(
    *,
    space: str,
    plan: resources_pb2.AddressSpacePlan | None,
    users: Iterable[resources_pb2.MessagingUser],
) -> broker_pb2.ClientAccess:
    """The access `space`'s broker must hold; a missing plan allows nothing more than logins."""
    spec = plan.spec if plan is not None else resources_pb2.AddressSpacePlanSpec()
    quotas = spec.quotas
    access = broker_pb2.ClientAccess(
        space=space,
        users=endpoint_users(users),
        allow_anonymous=spec.allow_anonymous,
        allow_plain_without_tls=spec.allow_plain_without_tls,
        limits=router_pb2.RouterLimits(
            max_connections=quotas.max_connections,
            max_connections_per_user=quotas.max_connections_per_user,
            max_message_size=max_message_size(quotas.max_message_size),
            max_links_per_connection=quotas.max_links_per_connection,
            max_sessions_per_connection=quotas.max_sessions_per_connection,
        ),
    )
    access.version = hashlib.sha256(access.SerializeToString(deterministic=True)).hexdigest()
    return access


def access_to_push(wanted: broker_pb2.ClientAccess, *, held: str) -> broker_pb2.ClientAccess | None:
    """What to push to a broker that says it holds version `held` ("" for none): `wanted`, or
    None when that is what it holds."""
    return None if held == wanted.version else wanted
