"""Run a frontier node: open its store, build the core, serve gRPC, stop cleanly on SIGTERM.

Alone (`hostring node --store sqlite:///...`) the node owns every domain. With `coordinator` it joins the
ring, keeps its state in Redis, and owns only its slice; readiness (the gRPC health service) means "owns its
slice at the current epoch and can write its store".

Threads: the gRPC server (grpc.aio) and the health service run on an event loop of their own thread ("node-loop"),
so `start_node` and `stop` stay plain blocking calls; the core runs on the core thread ("core", see
frontier_node/core_thread.py), which also keeps time; reports and URL histories are read on an "inspect" thread;
a clustered node adopts domains written during a handoff on a "catch-up" thread. Calls never wait on a thread of
their own, so no number of parked Leases can starve health checks or other calls.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from frontier_node.core.config import FrontierConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.ports import Outbox, Store, StoreLost
from frontier_node.core.views import FrontierStats
from frontier_node.metrics import StoreTimer, node_registry
from frontier_node.reading import SqliteReader, StoreReader
from frontier_node.service import FrontierService
from frontier_node.store.open import open_store, sqlite_path
from hostring.clock import WallClock
from hostring.limits import grpc_options
from hostring.loops import run_on, start_loop
from hostring.metrics import serve_metrics
from hostring.security import FRONTIER_ADMIN_METHODS, INSECURE, AioAdminTokenInterceptor, TlsConfig
from hostring.v1 import frontier_pb2

if TYPE_CHECKING:  # the cluster parts load only for a node that joins a ring (a lone node starts faster)
    from frontier_node.cluster import Slice
    from hostring.membership import NodeMembership

log = logging.getLogger("hostring.node")

T = TypeVar("T")
_CATCH_UP_S = 2.0
_SERVICE = frontier_pb2.DESCRIPTOR.services_by_name["Frontier"].full_name
_HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_METRICS_WAIT_S = 5.0


@dataclass
class RunningNode:
    """A started node: its gRPC server (grpc.aio, on `loop`), the service around the core, and the port it bound."""

    server: grpc.aio.Server
    service: FrontierService
    port: int
    health: health_aio.HealthServicer
    loop: asyncio.AbstractEventLoop
    _loop_thread: threading.Thread
    _stop: threading.Event
    membership: NodeMembership | None = None
    slice: Slice | None = None
    metrics_port: int | None = None
    reader: StoreReader | None = None
    _closed: list[bool] = field(default_factory=list)

    def set_serving(self, serving: bool) -> None:
        """Set the health of the node and of its Frontier service (from any thread); a faulted node never serves."""
        status = _SERVING if serving and not self.service.fault else _NOT_SERVING
        asyncio.run_coroutine_threadsafe(_set_health(self.health, status), self.loop)

    def stop(self, grace: float = 5.0, *, leave: bool = True) -> None:
        """Leave the ring, stop taking calls, let running ones finish, flush and close the store."""
        if self._closed:
            return
        self._closed.append(True)
        run_on(self.loop, self.health.enter_graceful_shutdown(), timeout=5.0)
        if self.membership is not None:
            self.membership.stop(leave=leave)
        if self.slice is not None:
            self.slice.stop()  # its inbox poller
        self._stop.set()
        self.service.core.release_waiters()  # parked Leases answer now instead of holding the shutdown up
        try:
            run_on(self.loop, self.server.stop(grace), timeout=grace + 5.0)
        finally:
            self.service.stop()
            with self.service.cond:
                store = self.service.frontier.store
                try:
                    store.flush()
                except Exception as e:  # a lost store cannot be flushed; closing it still releases it
                    log.error("final flush failed: %s", e)
                store.close()
            if self.reader is not None:
                self.reader.close()
            if self.slice is not None and self.slice.bodies is not None:
                self.slice.bodies.close()  # its thread for registering bodies (the core thread has stopped)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._loop_thread.join(timeout=5.0)
            if not self._loop_thread.is_alive():
                self.loop.close()


def start_node(
    store_url: str,
    listen: str,
    config: FrontierConfig | None = None,
    *,
    node_id: str = "node-0",
    run_id: str = "",
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
    reader: StoreReader | None = None
    # A clustered node leaves links other nodes own in its store's outbox (the owners' inboxes in Redis); a
    # standalone node owns every domain, so nothing is ever forwarded there.
    outbox: Outbox | None = None
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
        outbox = store
        reader = RedisStore.from_url(store_url, node_id=node_id, epoch=lambda: holder[0].epoch())
    else:
        store = open_store(store_url)
        frontier = Frontier(store, WallClock(), config, run_id=run_id)
        if store_url.startswith("sqlite:"):
            reader = SqliteReader(sqlite_path(store_url))
    if scope:
        frontier.add_scope(hosts=scope, domains=scope)
        store.flush()
    registry = None
    timer = None
    if metrics_port is not None:
        registry = CollectorRegistry()
        timer = StoreTimer(registry)
    service = FrontierService(
        frontier,
        node_id=node_id,
        epoch=slice_.epoch if slice_ else lambda: 0,
        lock=cond,
        outbox=outbox,
        reader=reader,
        store_timer=timer,
        primer=slice_.bodies if slice_ is not None else None,
    )
    loop, loop_thread = start_loop("node-loop")
    service.start()
    try:
        server, port, health_servicer = run_on(
            loop, _serve(service, listen, tls, admin_token, serving=not clustered), timeout=10.0
        )
    except BaseException:
        service.stop()
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(timeout=5.0)
        store.close()
        raise
    stop = threading.Event()
    node = RunningNode(server, service, port, health_servicer, loop, loop_thread, stop, None, slice_, None, reader)
    service.on_fault = lambda reason: node.set_serving(False)
    if registry is not None and metrics_port is not None:
        node_registry(lambda: _stats(node), slice_, registry)
        node.metrics_port = serve_metrics(metrics_port, registry, listen)
    if slice_ is not None:
        threading.Thread(target=_catch_up, args=(slice_, stop), name="catch-up", daemon=True).start()
        slice_.on_ready = node.set_serving
        service.on_fenced = slice_.let_go
        address = advertise or f"127.0.0.1:{port}"
        if address.endswith(":0"):  # advertised as the --listen address with port 0: the port bound
            address = f"{address[:-2]}:{port}"
        from hostring.membership import NodeMembership

        node.membership = NodeMembership(
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
    return node


async def _serve(
    service: FrontierService, listen: str, tls: TlsConfig, admin_token: str | None, *, serving: bool
) -> tuple[grpc.aio.Server, int, health_aio.HealthServicer]:
    """Bind and start the server (Frontier, health, reflection) on the running loop."""
    interceptors = [AioAdminTokenInterceptor(admin_token, FRONTIER_ADMIN_METHODS)] if admin_token else []
    server = grpc.aio.server(options=[*grpc_options(), ("grpc.so_reuseport", 0)], interceptors=interceptors)
    server.add_generic_rpc_handlers((service.handlers(),))
    health_servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((_SERVICE, _HEALTH, reflection.SERVICE_NAME), server)
    port = tls.add_port(server, listen)
    await _set_health(health_servicer, _SERVING if serving else _NOT_SERVING)
    await server.start()
    return server, port, health_servicer


async def _set_health(health_servicer: health_aio.HealthServicer, status: int) -> None:
    for name in ("", _SERVICE):
        await health_servicer.set(name, status)


def _stats(node: RunningNode) -> FrontierStats:
    """The core's counters for /metrics: the published snapshot, refreshed through the core thread when stale."""
    service = node.service
    if service.core.fresh():
        return service.core.snapshot.stats
    future = asyncio.run_coroutine_threadsafe(_fresh_stats(service), node.loop)
    try:
        return future.result(_METRICS_WAIT_S)
    except Exception:  # a busy or stopping node: the last published counters
        future.cancel()
        return service.core.snapshot.stats


async def _fresh_stats(service: FrontierService) -> FrontierStats:
    return (await service.core.submit(service.core.snapshot_op())).stats


def _transport(tls: TlsConfig, admin_token: str | None) -> str:
    """How the node is reached, for the start-up log line."""
    mode = "mutual TLS" if tls.mutual else "TLS" if tls.enabled else "plaintext"
    return f"{mode}, admin calls {'need the token' if admin_token else 'open: no admin token set'}"


def _catch_up(slice_: Slice, stop: threading.Event) -> None:
    """Every few seconds adopt domains this node owns but does not hold yet (first written during a handoff)."""
    while not stop.wait(_CATCH_UP_S):
        try:
            slice_.catch_up()
        except StoreLost:
            return  # the slice logged it once by name and turned health off; nothing more to adopt
        except Exception:
            log.exception("catch-up adoption failed; the next one tries again")


def stop_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT; install it before announcing readiness so no signal is missed."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    return done


YOUNG_GC_THRESHOLD = 20_000
"""Allocations between two collections of the youngest generation in a node process (Python's default: 700)."""


def quiet_gc() -> None:
    """Collect the oldest generation rarely: in a node process most objects are the frontier itself, long-lived, and
    a full collection walks all of them while every thread, the health service's included, stands still (about a
    second at a few hundred thousand URLs, growing with the node). The old generation is collected after 10,000
    passes of the middle one (instead of 10) and, as always, only once it has grown by a quarter. The youngest is
    collected every YOUNG_GC_THRESHOLD allocations: a Discover of 256 links allocates thousands of objects, and at
    Python's 700 the collector took ~5% of a node's Discover CPU (perf); a pass over 20,000 young objects takes a
    few ms at most."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_GC_THRESHOLD), middle, 10_000)


def serve_forever(node: RunningNode, done: threading.Event | None = None) -> None:
    """Block until SIGTERM or SIGINT (or `done`), then stop gracefully. The process is the node's: see quiet_gc."""
    quiet_gc()
    (done or stop_signals()).wait()
    log.info("stopping node")
    node.stop()
