"""RouterAgent gRPC: what the agent knows about each space's router network, for people and tools.

In: `GetTopology` (a space or all) and `GetAddressStats` (a space, an address or all). Out: the
routers with the generation the agent wants and the one each answered (and when it last
confirmed it), their mesh peers and why one is behind; per-address counters summed over the
routers of the space (RouterAdmin.GetStats).
A thin layer: the answers come from `RouterAgent`, which owns the state.
"""

from __future__ import annotations

import grpc
from enmasse.router_agent.agent import RouterAgent
from enmasse.v1 import router_agent_pb2, router_agent_pb2_grpc

SERVICE_NAME = "enmasse.v1.RouterAgent"


class RouterAgentServicer(router_agent_pb2_grpc.RouterAgentServicer):
    def __init__(self, agent: RouterAgent) -> None:
        self._agent = agent

    async def GetTopology(
        self, request: router_agent_pb2.TopologyRequest, context: grpc.aio.ServicerContext
    ) -> router_agent_pb2.Topology:
        found = self._agent.topology(request.space)
        if request.space and not found:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"address space '{request.space}' not found"
            )
        return router_agent_pb2.Topology(
            spaces=[
                router_agent_pb2.SpaceTopology(
                    space=routing.space,
                    generation=routing.generation,
                    addresses=len(routing.routes),
                    routers=[
                        router_agent_pb2.RouterState(
                            router_id=s.endpoint.router_id,
                            admin=s.endpoint.admin,
                            amqp=s.endpoint.amqp,
                            inter_router_port=s.endpoint.inter_router_port,
                            desired_generation=routing.generation,
                            applied_generation=s.applied,
                            reachable=s.reachable,
                            peers=s.peers,
                            error=s.error,
                            confirmed_at=s.confirmed_at,
                        )
                        for s in sorted(sessions, key=lambda s: s.endpoint.router_id)
                    ],
                )
                for routing, sessions in found
            ]
        )

    async def GetAddressStats(
        self, request: router_agent_pb2.AddressStatsRequest, context: grpc.aio.ServicerContext
    ) -> router_agent_pb2.AddressStatsResponse:
        if not request.space:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "space: must not be empty")
        if not self._agent.topology(request.space):
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"address space '{request.space}' not found"
            )
        stats, answered, silent = await self._agent.address_stats(
            space=request.space, address=request.address
        )
        return router_agent_pb2.AddressStatsResponse(
            space=request.space, addresses=stats, routers=answered, unreachable=silent
        )
