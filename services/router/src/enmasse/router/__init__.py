"""The router: the single entry point of an address space (DESIGN §4).

Pure domain (no network; unit-tested without processes):
- `config`: the configuration RouterAdmin applies (addresses, waypoints, mesh peers, limits) and
  the generation rule;
- `addressing`: what an address means here (configured route, dynamic reply address, unknown);
- `mesh`: link-state adverts, cheapest paths, reachable consumers, multicast trees;
- `balancing`: anycast target choice (least outstanding, round robin on ties);
- `fanout`: bounded per-consumer copy queues for multicast;
- `windows`: `refill`, which tops a sender's link up to its window (in messages bounded in bytes,
  by the rule in `enmasse.amqp.windows`);
- `stats`: counters;
- `access`: who gets in: the mesh secret routers log in to each other with, and client logins
  checked against the configuration's users (scrypt hashes).

On the shared AMQP engine (`enmasse.amqp.engine`):
- `forwarding`: the `Router` core: deliveries in, sends out, outcomes back, credit;
- `core`: the `ForwardingCore` Protocol, the core as its two sides see it (so that neither
  depends on `forwarding`);
- `inter_router`: its mesh side (`MeshLinks`): neighbours, adverts, links towards other routers;
- `waypoints`: its broker side (`BrokerLinks`): broker connections, senders, consumer feeds;
- `points`: the per-address and per-link state the three share;
- `handlers`: thin engine handlers for client, inter-router and broker connections, and
  `RouterHandlers`, the factory that makes them;
- `admin`: `AdminView` (protobuf in and out over the core: configurations, stats, listings) and
  the RouterAdmin gRPC servicer, which runs it on the engine thread (`engine.call`);
- `main`: `enmasse-router`, wiring and start-up only (listeners, TLS, who is checked where).

Imports go one way: `main` -> `admin`, `handlers` -> `forwarding` -> `inter_router`, `waypoints`
-> `core` -> `points` and the pure domain; no module imports one that imports it back.
"""
