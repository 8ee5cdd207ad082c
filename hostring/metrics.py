"""Serving Prometheus metrics over HTTP, the same way in every process."""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from hostring import __version__


def serve_metrics(port: int, registry: CollectorRegistry, listen: str = "") -> int:
    """Serve `registry` at http://HOST:port/metrics, HOST taken from `listen` (HOST:PORT; all interfaces if unset).

    Returns the bound port (port 0 picks a free one).
    """
    host = listen.rpartition(":")[0].strip("[]") if listen else ""
    server, _ = start_http_server(port, addr=host or "0.0.0.0", registry=registry)
    return int(server.server_port)


def register_build_info(registry: CollectorRegistry, role: str) -> None:
    """`hostring_build_info{role, version, python} 1`: which build a process runs (join on it in queries)."""
    info = Gauge(
        "hostring_build_info",
        "Always 1: the hostring version, Python version and role of this process",
        ["role", "version", "python"],
        registry=registry,
    )
    info.labels(role, __version__, platform.python_version()).set(1)
