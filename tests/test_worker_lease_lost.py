"""A fetch whose lease the node takes back while the body is still arriving, run for real: a node's gRPC service on
loopback, a LocalWeb server that trickles the body, and fetch_worker.Worker between them.

Politeness is one request in flight per host, cluster-wide: once a renewal answers that the lease is gone (here it
was released by an operator; expiry or a newer generation answer the same), the node may give the host to another
worker, so the request is cut at once. Nothing of it is archived, and no Complete reports it (the node would only
keep it as late evidence): the page stays scheduled, to be fetched again under a lease of its own.

A ring change is not a lost lease: the node that gave a domain away answers unknown_lease, but the new owner adopted
the leased row, and the renewals (and the Complete) go on there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from warcio.archiveiterator import ArchiveIterator

from coordinator.server import start_coordinator
from fetch_worker.fetch import Fetcher
from fetch_worker.metrics import WorkerMetrics
from fetch_worker.netpolicy import NetworkPolicy
from fetch_worker.warc import WarcWriter
from fetch_worker.worker import Worker
from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.server import RunningNode, start_node
from frontier_node.service import FrontierService
from frontier_node.store.memory import MemoryStore
from hostring.client import StaticRouter
from hostring.clock import WallClock
from hostring.limits import grpc_options
from hostring.membership import RingWatcher
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from hostring_testing import Hit, Site
from hostring_testing.cluster import wait_for
from hostring_testing.pages import html_page
from hostring_testing.server import CountingWeb
from tests.test_node_shell import RPC_S, Served, seed_past_robots

pytestmark = [pytest.mark.timeout(90)]

UA = "hostring-test/0.1 (+https://example.invalid/lease-lost-tests)"
BODY = "<html><body>" + "slow " * 100 + "</body></html>"
TRICKLE_S = 0.05  # the whole body would take ~26 s; the lease is gone within a few seconds


@pytest.fixture
def web() -> Iterator[CountingWeb]:
    with CountingWeb({"a": Site({"/slow": html_page(BODY, trickle_s=TRICKLE_S)})}) as w:
        yield w


async def _until(what: Callable[[], bool], timeout_s: float, why: str) -> None:
    """Wait (polling) until `what()` holds; fail naming `why` after `timeout_s`."""
    end = time.monotonic() + timeout_s
    while not what():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting: {why}")
        await asyncio.sleep(0.02)


def test_a_fetch_whose_lease_is_gone_is_cut_off_unreported_and_unarchived(web: CountingWeb, tmp_path: Path) -> None:
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0), lease_s=2.0)
    served = Served(FrontierService(Frontier(MemoryStore(), WallClock(), config)))
    page = web.url("a", "/slow")
    host = page.split("/")[2].split(":")[0]
    metrics = WorkerMetrics()
    try:
        with grpc.insecure_channel(served.address, options=grpc_options()) as channel:
            stub = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
            seed_past_robots(stub, page)

            async def scenario() -> Worker:
                warc = WarcWriter(tmp_path / "warc", prefix="lost")
                fetcher = Fetcher(NetworkPolicy(["127.0.0.0/8"]), UA)
                worker = Worker(StaticRouter(served.address), fetcher, warc=warc, metrics=metrics)
                stop = asyncio.Event()
                run = asyncio.create_task(worker.run(stop, grace_s=0.0))
                try:
                    await _until(lambda: web.has_started("a", "/slow"), 20, "the worker's request for /slow")
                    # Not leased again once released (this test is about the fetch that lost its lease).
                    stub.PauseHost(pb.PauseHostRequest(host=host, paused=True), timeout=RPC_S)
                    released = stub.ReleaseLeases(pb.ReleaseLeasesRequest(every_worker=True), timeout=RPC_S)
                    assert released.released == 1
                    await _until(lambda: bool(web.hits_for("a")), 40, "the server to log the request's end")
                    (hit,) = web.hits_for("a")
                    assert hit.resource == "/slow" and not hit.complete, "the request was not cut off"
                    await _until(lambda: worker.stats.leases_lost == 1, 10, "the worker to count the lost lease")
                finally:
                    stop.set()
                    await run
                    await worker.close()
                return worker

            worker = asyncio.run(scenario())
            url = stub.GetUrl(pb.GetUrlRequest(url=page), timeout=RPC_S)
    finally:
        served.close()

    (hit,) = web.hits_for("a")
    assert 0 < hit.bytes_sent < len(BODY.encode()), hit
    assert hit.end - hit.start < len(BODY) * TRICKLE_S / 2  # cut, not waited out
    assert (worker.stats.fetched, worker.stats.stale, worker.stats.in_flight) == (0, 0, 0)
    assert metrics.registry.get_sample_value("hostring_worker_leases_lost_total") == 1.0
    # The node heard nothing of it: the page is scheduled again (released), with no completion nor late evidence.
    assert url.state == "scheduled"
    assert [t.event for t in url.history] == ["admit", "schedule", "lease", "release"]
    records = []
    for path in sorted((tmp_path / "warc").glob("*.warc.gz")):
        with path.open("rb") as stream:
            records += [r.rec_type for r in ArchiveIterator(stream)]
    assert "response" not in records and "revisit" not in records, records


def _slow(web: CountingWeb) -> list[Hit]:
    """The requests for /slow the web has seen end."""
    return [h for h in web.hits if h.resource == "/slow"]


def _epoch(node: RunningNode) -> int:
    assert node.slice is not None
    return int(node.slice.epoch())


def test_a_fetch_whose_domain_moves_to_another_node_keeps_its_lease_there(empty_redis: str) -> None:
    """Eight slow pages in flight on node a when node b joins: the domains b takes keep their fetches (renewed at b,
    completed at b), none is cut, none is fetched twice."""
    labels = [f"o{i}" for i in range(8)]
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0), lease_s=2.0)
    body = "<html><body>" + "slow " * 30 + "</body></html>"  # ~9 s at TRICKLE_S a byte: renewed many times
    sites = {label: Site({"/slow": html_page(body, trickle_s=TRICKLE_S)}) for label in labels}
    coordinator = start_coordinator("127.0.0.1:0", heartbeat_timeout_s=10.0)
    address = f"127.0.0.1:{coordinator.port}"
    nodes: list[RunningNode] = []
    try:
        with CountingWeb(sites) as web:
            a = start_node(empty_redis, "127.0.0.1:0", config, node_id="a", coordinator=address)
            nodes.append(a)
            wait_for(lambda: _epoch(a) >= 1, 10.0, "node a to join")
            with grpc.insecure_channel(f"127.0.0.1:{a.port}", options=grpc_options()) as channel:
                stub = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
                links = [pb.Link(observed=web.url(label, "/slow"), seed=True) for label in labels]
                stub.Discover(pb.DiscoverRequest(links=links), timeout=RPC_S)

            async def scenario() -> tuple[Worker, set[str]]:
                watcher = RingWatcher(address)
                await watcher.start()
                worker = Worker(watcher, Fetcher(NetworkPolicy(["127.0.0.0/8"]), UA))
                stop = asyncio.Event()
                run = asyncio.create_task(worker.run(stop))
                try:
                    await _until(lambda: all(web.has_started(lb, "/slow") for lb in labels), 30, "every request")
                    b = await asyncio.to_thread(
                        start_node, empty_redis, "127.0.0.1:0", config, node_id="b", coordinator=address
                    )
                    nodes.append(b)
                    await _until(lambda: _epoch(a) >= 2 and _epoch(b) >= 2, 10, "both nodes to apply epoch 2")
                    with b.service.cond:
                        moved = set(b.service.frontier.domains)
                    await _until(lambda: len(_slow(web)) >= len(labels), 40, "every slow page to end")
                    await _until(lambda: worker.stats.fetched == 2 * len(labels), 10, "every completion")
                finally:
                    stop.set()
                    await run
                    await worker.close()
                    await watcher.close()
                return worker, moved

            worker, moved = asyncio.run(scenario())
            hits = _slow(web)
    finally:
        for node in nodes:
            node.stop(grace=1.0)
        coordinator.stop()
    assert moved, "node b took none of the domains: the ring change did not touch a fetch in flight"
    assert all(h.complete for h in hits) and len(hits) == len(labels), hits
    assert (worker.stats.leases_lost, worker.stats.stale) == (0, 0)
