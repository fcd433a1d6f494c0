"""enmasse.analytics: OpenTelemetry traces of EnMasse-py -> Parquet tables -> HTML dashboard.

What flows in: OTLP-JSON span files (the Collector file exporter's format), written by every
process through `enmasse.common.tracing`. What flows out: Parquet tables (throughput per address
and per space over time windows, end-to-end latency percentiles per address and per address type,
per-hop latency breakdown, errors and rejections by condition, top talkers per tenant,
control-plane timings) and a static dashboard (docs/tracing.md has every schema).

The span naming convention the message plane follows, and this package reads
(constants in `enmasse.common.tracing`):

    amqp.send               producer, root of the message's trace; ends at settlement
    router.route            router: arrived -> forwarded to a consumer link (or back out)
    router.waypoint         router: arrived -> forwarded to the broker holding the address
    broker.enqueue          broker: arrived -> stored (fsync when durable) and settled
    broker.queue_residence  broker: stored -> picked for a consumer
    broker.dequeue          broker: picked -> sent on the consumer's link
    amqp.deliver            consumer: received -> handed to the application
    amqp.settle             consumer: the application's disposition -> settled
    address.create          config service: an Address written for the first time
    address.phase           config service: an Address's phase changed (enmasse.phase)

with attributes `messaging.destination.name` (the AMQP address), `enmasse.space`,
`enmasse.address_type`, `enmasse.outcome`, `enmasse.error.condition`, `messaging.client.id`,
`messaging.message.body.size`, `enmasse.address` (resource name, control plane). gRPC spans come
from the OpenTelemetry gRPC instrumentation with its own `rpc.*` attributes.

Modules: `spans` (read + flatten), `tables` (pure DataFrame -> DataFrame), `dashboard` (rows ->
HTML), `job` (the order of work and the files), `session` (the Spark session), `synthetic`
(generated span files for tests and the benchmark), `main` (the command line).
"""
