"""Why broker files changed: the storage-controller's commit reasons for the GitOps write-back.

In: the brokers a render had before, the placement it rendered (None: the space is gone), the
broker ids whose files changed and the space's addresses (for their plans). Out: one line per
changed broker file ("add broker shop-broker-1 for address shop/orders (plan
standard-large-queue)", "remove broker shop-broker-1 after drain"), which
`enmasse.resources.gitops_writeback.WorkloadRepository` commits and pushes as the message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from enmasse.resources.contracts import ACTIVE
from enmasse.resources.rendered_brokers import BrokerWorkload
from enmasse.storage_controller.placement import Placement
from enmasse.v1 import resources_pb2


def change_reasons(
    *,
    space: str,
    before: Mapping[str, BrokerWorkload],
    placement: Placement | None,
    changed: Sequence[str],
    addresses: Sequence[resources_pb2.Address] = (),
) -> list[str]:
    """One line per changed broker file, saying what changed and why."""
    plans = {a.metadata.name: a.spec.plan for a in addresses}
    reasons = []
    for broker_id in changed:
        if placement is None:
            reasons.append(f"remove broker {broker_id}: address space {space} deleted")
            continue
        broker = placement.brokers.get(broker_id)
        if broker is None:
            reasons.append(f"remove broker {broker_id} after drain")
            continue
        held = placement.holders(broker_id) or ([broker.owner] if broker.owner else [])
        names = ", ".join(
            f"{space}/{name}" + (f" (plan {plans[name]})" if plans.get(name) else "")
            for name in held
        )
        verb = "update" if broker_id in before else "add"
        state = "" if broker.state == ACTIVE else f" [{broker.state.lower()}]"
        what = f" for address {names}" if names else ""
        reasons.append(f"{verb} broker {broker_id}{what}{state}")
    return reasons
