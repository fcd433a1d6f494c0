"""The web console: address spaces, addresses and messaging users through the admin API."""
