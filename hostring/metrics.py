"""Serving Prometheus metrics over HTTP, the same way in every process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server


def serve_metrics(port: int, registry: CollectorRegistry, listen: str = "") -> int:
    """Serve `registry` at http://HOST:port/metrics, HOST taken from `listen` (HOST:PORT; all interfaces if unset).

    Returns the bound port (port 0 picks a free one).
    """
    host = listen.rpartition(":")[0].strip("[]") if listen else ""
    server, _ = start_http_server(port, addr=host or "0.0.0.0", registry=registry)
    return int(server.server_port)
