"""The frontier node: scheduler core, state machine, robots, budgets, stores and the gRPC service."""

import hostring  # noqa: F401  (importing it first refuses compiled modules older than their sources: hostring/native.py)
