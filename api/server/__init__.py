"""The server process and its HTTP plumbing: the app factory, workers, middlewares, metrics' export, the
routes. Everything above the services (docs/architecture.md)."""
