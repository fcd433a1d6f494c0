"""The broker (DESIGN §4): one process that takes ownership of messages for `queue`, `topic` and
`subscription` addresses, keeps them (in memory, and in a crash-safe journal when durable) and hands
them to consumers.

Layers, bottom up:
- `plan`, `entry`: what a queue is told (plan settings) and what it holds (a message entry).
- `queue`, `topic`: the pure domain: competing consumers, redelivery, dead-lettering, browse, TTL,
  memory limits, subscription queues. No network, no files: unit tests drive them directly.
- `journal`: append-only checksummed segments, group commit, recovery, reclaim.
- `broker`: the `Broker` root that owns queues, topics, the journal and the address catalog.
- `transactions`: local AMQP transactions over the `Broker` (held until discharge, one journal
  record per commit); `coordinator`: their AMQP side (Declare, Discharge, transactional states).
- `handler`: the AMQP side on the shared engine (`enmasse.amqp`); `admin`: BrokerAdmin gRPC;
  `drain`: at-least-once hand-off to another broker; `main`: wiring.
"""
