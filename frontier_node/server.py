"""Run a frontier node: open its store, build the core, serve gRPC, tick timers, stop cleanly on SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass

import grpc

from frontier_node.core.config import FrontierConfig
from frontier_node.core.frontier import Frontier
from frontier_node.service import FrontierService
from frontier_node.store.open import open_store
from hostring.clock import WallClock
from hostring.v1 import frontier_pb2_grpc as pb_grpc

log = logging.getLogger("hostring.node")

_TICK_S = 0.2


@dataclass
class RunningNode:
    """A started node: its gRPC server, the service around the core, and the port it bound."""

    server: grpc.Server
    service: FrontierService
    port: int
    _stop: threading.Event

    def stop(self, grace: float = 5.0) -> None:
        """Stop taking calls, let running ones finish, flush and close the store."""
        self._stop.set()
        self.server.stop(grace).wait()
        with self.service.cond:
            self.service.frontier.store.flush()
            self.service.frontier.store.close()


def start_node(store_url: str, listen: str, config: FrontierConfig | None = None, *, node_id: str = "node-0",
               run_id: str = "", max_workers: int = 32, scope: Sequence[str] = ()) -> RunningNode:
    """Open the store (recovering its state), and serve the Frontier service on `listen` (HOST:PORT, port 0 picks).

    `scope` lists hosts or registrable domains admitted in the "list" scope mode.
    """
    store = open_store(store_url)
    frontier = Frontier(store, WallClock(), config, run_id=run_id)
    if scope:
        frontier.add_scope(hosts=scope, domains=scope)
        store.flush()
    service = FrontierService(frontier, node_id=node_id)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        options=[("grpc.max_receive_message_length", 64 * 2**20), ("grpc.so_reuseport", 0)],
    )
    pb_grpc.add_FrontierServicer_to_server(service, server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"could not listen on {listen!r}")
    server.start()
    stop = threading.Event()
    threading.Thread(target=_ticker, args=(service, stop), name="ticker", daemon=True).start()
    log.info("node %s serving on port %d, store %s, run %s", node_id, port, store_url, frontier.run_id)
    return RunningNode(server, service, port, stop)


def _ticker(service: FrontierService, stop: threading.Event) -> None:
    """Expire leases and release due retries even when no call arrives, and wake waiting Lease calls."""
    while not stop.wait(_TICK_S):
        with service.cond:
            service.frontier.tick()
            service.frontier.store.flush()
            service.cond.notify_all()


def serve_forever(node: RunningNode) -> None:
    """Block until SIGTERM or SIGINT, then stop gracefully."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("stopping node")
    node.stop()
