"""enmasse.router_agent: address config and placements in, router configurations out (DESIGN §3)."""
