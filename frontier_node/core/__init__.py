"""The sans-I/O core of a frontier node: plain objects, an injected clock, no sockets and no database."""
