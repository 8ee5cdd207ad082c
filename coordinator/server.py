"""Run the coordinator: load membership (from Redis when given), serve gRPC, expire silent nodes, stop cleanly.

The server is grpc.aio on an event loop of its own thread, so `start_coordinator` and `stop` are plain blocking
calls like the frontier node's, and an embedding process (tests, the all-in-one launcher) keeps its main thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]
from grpc_reflection.v1alpha import reflection

from coordinator.membership import Membership, MembershipBackend, MemoryBackend, RedisBackend
from coordinator.service import CoordinatorService
from hostring.clock import Clock, WallClock
from hostring.limits import grpc_options
from hostring.loops import run_on, start_loop
from hostring.security import COORDINATOR_ADMIN_METHODS, INSECURE, AioAdminTokenInterceptor, TlsConfig
from hostring.v1 import coordinator_pb2
from hostring.v1 import coordinator_pb2_grpc as pb_grpc

log = logging.getLogger("hostring.coordinator")

T = TypeVar("T")
_SERVICE = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name
_HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

SERVER_OPTIONS: list[tuple[str, Any]] = [
    *grpc_options(),
    ("grpc.so_reuseport", 0),
    # Clients ping idle WatchRing streams to notice a vanished coordinator; allow it instead of answering GOAWAY.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]


@dataclass
class RunningCoordinator:
    """A started coordinator: its gRPC server (grpc.aio, on `loop`), the port it bound, and how to stop it."""

    server: grpc.aio.Server
    port: int
    service: CoordinatorService
    loop: asyncio.AbstractEventLoop
    _thread: threading.Thread
    _expiry: asyncio.Task[None]
    _redis: redis.Redis | None = None
    health: health_aio.HealthServicer | None = None
    _stopped: bool = field(default=False, init=False)

    @property
    def redis_client(self) -> redis.Redis | None:
        """The Redis client membership is kept with, or None when it is kept in memory."""
        return self._redis

    def stop(self, grace: float = 2.0) -> None:
        """End WatchRing streams, let running calls finish within `grace`, then stop the loop. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        try:
            run_on(self.loop, self._shutdown(grace), timeout=grace + 5.0)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5.0)
            if not self._thread.is_alive():
                self.loop.close()
            if self._redis is not None:
                self._redis.close()

    async def _shutdown(self, grace: float) -> None:
        if self.health is not None:
            await self.health.enter_graceful_shutdown()
        self._expiry.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._expiry
        await self.service.close()
        await self.server.stop(grace)


def start_coordinator(
    listen: str,
    redis_url: str | None = None,
    heartbeat_timeout_s: float = 10.0,
    *,
    namespace: str = "hostring",
    clock: Clock | None = None,
    tls: TlsConfig | None = None,
    admin_token: str | None = None,
) -> RunningCoordinator:
    """Serve the Coordinator service on `listen` (HOST:PORT, port 0 picks); membership in Redis if `redis_url`.

    Members loaded from Redis get one heartbeat timeout to be heard from again before they expire. `tls` secures
    the server (mutual TLS when it has a CA); with `admin_token`, Register and Leave need it as a bearer token.
    The standard health service answers SERVING while the coordinator runs, and reflection serves grpcurl.
    """
    if heartbeat_timeout_s <= 0:
        raise ValueError("heartbeat_timeout_s must be > 0")
    tls = tls or INSECURE
    if tls.enabled:
        tls.server_credentials()  # refuse a CA without a certificate before anything is opened
    client: redis.Redis | None = None
    backend: MembershipBackend = MemoryBackend()
    if redis_url:
        client = redis.Redis.from_url(
            redis_url, socket_timeout=2.0, socket_connect_timeout=2.0, client_name="hostring-coordinator"
        )
        backend = RedisBackend(client, namespace)
    try:
        membership = Membership(
            clock or WallClock(),
            heartbeat_timeout_s=heartbeat_timeout_s,
            backend=backend,
            stall_after_s=heartbeat_timeout_s / 2,
        )
    except Exception:
        if client is not None:
            client.close()
        raise
    loop, thread = start_loop("coordinator")
    try:
        server, port, service, expiry, health = run_on(
            loop, _serve(listen, membership, heartbeat_timeout_s, tls, admin_token), timeout=10.0
        )
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5.0)
        loop.close()
        if client is not None:
            client.close()
        raise
    mode = "mutual TLS" if tls.mutual else "TLS" if tls.enabled else "plaintext"
    log.info(
        "coordinator serving on port %d (%s, membership changes %s) at epoch %d with %d members (%s)",
        port,
        mode,
        "need the admin token" if admin_token else "open: no admin token set",
        membership.epoch,
        len(membership.ring()),
        "redis" if redis_url else "in memory",
    )
    return RunningCoordinator(server, port, service, loop, thread, expiry, client, health)


async def _serve(
    listen: str,
    membership: Membership,
    timeout_s: float,
    tls: TlsConfig,
    admin_token: str | None,
) -> tuple[grpc.aio.Server, int, CoordinatorService, asyncio.Task[None], health_aio.HealthServicer]:
    """Bind and start the server (Coordinator, health, reflection), and the expiry task, on the running loop."""
    service = CoordinatorService(membership)
    interceptors = [AioAdminTokenInterceptor(admin_token, COORDINATOR_ADMIN_METHODS)] if admin_token else []
    server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=interceptors)
    pb_grpc.add_CoordinatorServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection((_SERVICE, _HEALTH, reflection.SERVICE_NAME), server)
    port = tls.add_port(server, listen)
    await server.start()
    for name in ("", _SERVICE):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    expiry = asyncio.get_running_loop().create_task(service.run_expiry(min(1.0, timeout_s / 5)), name="expiry")
    return server, port, service, expiry, health


def serve_forever(coordinator: RunningCoordinator) -> None:
    """Block until SIGTERM or SIGINT, then stop gracefully."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("stopping coordinator")
    coordinator.stop()
