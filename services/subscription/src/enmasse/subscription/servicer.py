"""SubscriptionService gRPC: a thin layer over `DurableSubscriptions`.

In: Lookup and ListSubscriptions requests (from routers, the CLI, tests). Out: the answer, or the
service's `Refusal` turned into the gRPC status and message it carries. Nothing else happens here.
"""

from __future__ import annotations

import grpc
from enmasse.subscription.choice import Refusal
from enmasse.subscription.subscriptions import DurableSubscriptions
from enmasse.v1 import subscription_pb2, subscription_pb2_grpc

SERVICE_NAME = "enmasse.v1.SubscriptionService"


class SubscriptionServicer(subscription_pb2_grpc.SubscriptionServiceServicer):
    def __init__(self, subscriptions: DurableSubscriptions) -> None:
        self._subscriptions = subscriptions

    async def Lookup(
        self, request: subscription_pb2.LookupRequest, context: grpc.aio.ServicerContext
    ) -> subscription_pb2.SubscriptionLocation:
        try:
            return await self._subscriptions.lookup(request)
        except Refusal as refusal:
            await context.abort(refusal.code, refusal.message)
            raise  # abort raises; this keeps type checkers content

    async def ListSubscriptions(
        self, request: subscription_pb2.ListSubscriptionsRequest, context: grpc.aio.ServicerContext
    ) -> subscription_pb2.SubscriptionList:
        try:
            return await self._subscriptions.list(request)
        except Refusal as refusal:
            await context.abort(refusal.code, refusal.message)
            raise
