"""Coordinator: membership and ring epochs, rebalancing, the hostring CLI and the local launcher."""
