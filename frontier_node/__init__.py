"""The frontier node: scheduler core, state machine, robots, budgets, stores and the gRPC service."""
