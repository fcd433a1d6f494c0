"""enmasse.subscription: durable subscriptions of standard spaces, which broker holds each."""
