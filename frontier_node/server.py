"""Run a frontier node: open its store, build the core, serve gRPC, tick timers, stop cleanly on SIGTERM.

Alone (`hostring node --store sqlite:///...`) the node owns every domain. With `coordinator` it joins the
ring, keeps its state in Redis, and owns only its slice; readiness (the gRPC health service) means "owns its
slice at the current epoch and can write its store".
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from frontier_node.core.config import FrontierConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.ports import Store
from frontier_node.metrics import StoreTimer, node_registry
from frontier_node.service import FrontierService
from frontier_node.store.open import open_store
from hostring.clock import WallClock
from hostring.metrics import serve_metrics
from hostring.security import FRONTIER_ADMIN_METHODS, INSECURE, AdminTokenInterceptor, TlsConfig
from hostring.v1 import frontier_pb2
from hostring.v1 import frontier_pb2_grpc as pb_grpc

if TYPE_CHECKING:  # the cluster parts load only for a node that joins a ring (a lone node starts faster)
    from frontier_node.cluster import Slice
    from hostring.membership import NodeMembership

log = logging.getLogger("hostring.node")

_TICK_S = 0.2
_CATCH_UP_S = 2.0
_SERVICE = frontier_pb2.DESCRIPTOR.services_by_name["Frontier"].full_name


@dataclass
class RunningNode:
    """A started node: its gRPC server, the service around the core, and the port it bound."""

    server: grpc.Server
    service: FrontierService
    port: int
    health: health.HealthServicer
    _stop: threading.Event
    membership: NodeMembership | None = None
    slice: Slice | None = None
    metrics_port: int | None = None
    _closed: list[bool] = field(default_factory=list)

    def stop(self, grace: float = 5.0, *, leave: bool = True) -> None:
        """Leave the ring, stop taking calls, let running ones finish, flush and close the store."""
        if self._closed:
            return
        self._closed.append(True)
        self.health.enter_graceful_shutdown()
        if self.membership is not None:
            self.membership.stop(leave=leave)
        self._stop.set()
        self.server.stop(grace).wait()
        with self.service.cond:
            self.service.frontier.store.flush()
            self.service.frontier.store.close()


def start_node(
    store_url: str,
    listen: str,
    config: FrontierConfig | None = None,
    *,
    node_id: str = "node-0",
    run_id: str = "",
    max_workers: int = 32,
    scope: Sequence[str] = (),
    coordinator: str = "",
    advertise: str = "",
    weight: int = 1,
    metrics_port: int | None = None,
    tls: TlsConfig | None = None,
    admin_token: str | None = None,
) -> RunningNode:
    """Open the store, build the core and serve the Frontier service on `listen` (HOST:PORT; port 0 picks).

    `scope` lists hosts or registrable domains admitted in the "list" scope mode. With `coordinator`, the
    node registers as `node_id` reachable at `advertise` (default: 127.0.0.1 and the bound port; a port 0 in
    it stands for the bound port).
    `tls` secures the server and the connection to the coordinator (plaintext by default). With `admin_token`,
    PauseHost and SetHostPolicy need it as a bearer token, and the node sends it when it joins or leaves the ring.
    """
    tls = tls or INSECURE
    if tls.enabled:
        tls.server_credentials()  # refuse a CA without a certificate before anything is opened
    cond = threading.Condition()
    clustered = bool(coordinator)
    store: Store
    slice_: Slice | None = None
    if clustered:
        if not store_url.startswith(("redis://", "rediss://")):
            raise ValueError("a node in a cluster keeps its state in Redis: give --store redis://HOST:PORT/DB")
        from frontier_node.cluster import Slice
        from frontier_node.store.redis import RedisStore

        holder: list[Slice] = []
        store = RedisStore.from_url(store_url, node_id=node_id, epoch=lambda: holder[0].epoch())
        slice_ = Slice(node_id, store, cond)
        holder.append(slice_)
        frontier = Frontier(store, WallClock(), config, run_id=run_id, owns=slice_.owns, recover=False)
        slice_.frontier = frontier
    else:
        store = open_store(store_url)
        frontier = Frontier(store, WallClock(), config, run_id=run_id)
    if scope:
        frontier.add_scope(hosts=scope, domains=scope)
        store.flush()
    service = FrontierService(frontier, node_id=node_id, epoch=slice_.epoch if slice_ else lambda: 0, lock=cond)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        options=[("grpc.max_receive_message_length", 64 * 2**20), ("grpc.so_reuseport", 0)],
        interceptors=[AdminTokenInterceptor(admin_token, FRONTIER_ADMIN_METHODS)] if admin_token else [],
    )
    pb_grpc.add_FrontierServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (_SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
    )
    if metrics_port is not None:
        registry = node_registry(frontier, cond, slice_)
        service.store_timer = StoreTimer(registry)
        metrics_port = serve_metrics(metrics_port, registry, listen)
    port = tls.add_port(server, listen)
    if port == 0:
        raise OSError(f"could not listen on {listen!r}")
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", _SERVICE):
        health_servicer.set(name, not_serving if clustered else serving)
    server.start()
    stop = threading.Event()
    threading.Thread(target=_ticker, args=(service, stop, slice_), name="ticker", daemon=True).start()
    membership = None
    if slice_ is not None:

        def ready(owned: bool) -> None:
            for name in ("", _SERVICE):
                health_servicer.set(name, serving if owned else not_serving)

        slice_.on_ready = ready
        service.on_fenced = slice_.let_go
        address = advertise or f"127.0.0.1:{port}"
        if address.endswith(":0"):  # advertised as the --listen address with port 0: the port bound
            address = f"{address[:-2]}:{port}"
        from hostring.membership import NodeMembership

        membership = NodeMembership(
            coordinator, node_id, address, weight, on_ring=slice_.apply, tls=tls, admin_token=admin_token
        ).start()
    log.info(
        "node %s serving on port %d (%s), store %s, run %s",
        node_id,
        port,
        _transport(tls, admin_token),
        store_url,
        frontier.run_id,
    )
    return RunningNode(server, service, port, health_servicer, stop, membership, slice_, metrics_port)


def _transport(tls: TlsConfig, admin_token: str | None) -> str:
    """How the node is reached, for the start-up log line."""
    mode = "mutual TLS" if tls.mutual else "TLS" if tls.enabled else "plaintext"
    return f"{mode}, admin calls {'need the token' if admin_token else 'open: no admin token set'}"


def _ticker(service: FrontierService, stop: threading.Event, slice_: Slice | None = None) -> None:
    """Expire leases and release due retries even when no call arrives, and wake waiting Lease calls.

    In a cluster, every few seconds also adopt domains this node owns but does not hold yet.
    """
    last_catch_up = time.monotonic()
    while not stop.wait(_TICK_S):
        if slice_ is not None and time.monotonic() - last_catch_up > _CATCH_UP_S:
            last_catch_up = time.monotonic()
            try:
                slice_.catch_up()
            except Exception:
                log.exception("catch-up adoption failed; the next one tries again")
        with service.cond:
            try:
                service.frontier.tick()
                service.frontier.store.flush()
            except Exception:
                log.exception("tick failed; the next one tries again")
            service.cond.notify_all()


def stop_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT; install it before announcing readiness so no signal is missed."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    return done


def serve_forever(node: RunningNode, done: threading.Event | None = None) -> None:
    """Block until SIGTERM or SIGINT (or `done`), then stop gracefully."""
    (done or stop_signals()).wait()
    log.info("stopping node")
    node.stop()
