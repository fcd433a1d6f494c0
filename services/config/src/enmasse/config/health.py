"""Readiness that tells the truth: the config service is SERVING only while etcd answers.

In: the store and the running server. Out: the gRPC health status (overall and for the
ConfigService) flipped to NOT_SERVING when etcd stops answering and back to SERVING when it
answers again, checked every few seconds. Kubernetes readiness probes and `enmasse up` read it;
the service itself keeps running and answers UNAVAILABLE meanwhile.
"""

from __future__ import annotations

import asyncio

import structlog
from enmasse.common.serving import RunningServer
from enmasse.config.store import Store, StoreRefused, StoreUnavailable

log = structlog.get_logger(__name__)


async def follow_store_health(
    store: Store, running: RunningServer, *, service: str, every: float = 2.0
) -> None:
    serving = True
    while True:
        try:
            await store.revision()
            reachable = True
        except (StoreUnavailable, StoreRefused) as error:
            reachable = False
            if serving:
                log.warning("etcd stopped answering", error=str(error))
        if reachable != serving:
            serving = reachable
            for name in ("", service):
                await running.set_serving(serving, service=name)
            log.info("health", serving=serving)
        await asyncio.sleep(every)
