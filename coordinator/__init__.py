"""The coordinator service: membership, ring epochs and handoff orchestration (it imports only the kernel)."""
