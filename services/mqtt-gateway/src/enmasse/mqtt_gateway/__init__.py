"""The MQTT gateway of a standard address space: MQTT 3.1.1 and 5.0 clients in, AMQP to the
space's routers out (`packets` the codec, `mapping` what MQTT means as AMQP, `uplink` one
client's AMQP connection, `session` one client's MQTT connection, `gateway` the listener,
`main` the wiring)."""
