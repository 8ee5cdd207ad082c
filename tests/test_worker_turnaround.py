"""The worker's lease loop with leases that travel with completions, run for real: a node's gRPC service on loopback,
a LocalWeb on loopback, and fetch_worker.Worker between them.

The worker keeps a long-poll Lease parked on its node and asks for new leases with every completion batch; the
crawl still drains, fetches every page once, and keeps one request in flight per host with the delay between.
Items a node leased along with a completion after the worker stopped taking work are handed back at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import grpc
import pytest

from fetch_worker.fetch import Fetcher
from fetch_worker.netpolicy import NetworkPolicy
from fetch_worker.worker import Worker
from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.service import FrontierService
from frontier_node.store.memory import MemoryStore
from hostring.client import StaticRouter
from hostring.clock import WallClock
from hostring.limits import grpc_options
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from hostring_testing import LocalWeb, Site
from hostring_testing.crawls import politeness_violations
from hostring_testing.pages import html_page
from tests.test_node_shell import RPC_S, Served, seed_past_robots, seeds

pytestmark = [pytest.mark.timeout(90)]

UA = "hostring-test/0.1 (+https://example.invalid/turnaround-tests)"
PAGES = 12


def _site(label: str) -> Site:
    """A page per path that links to every page of its site (navigation repeated on each page)."""
    nav = "".join(f'<a href="/p{i}">p{i}</a> ' for i in range(PAGES))
    pages = {"/": html_page(f"<html><body>{label} home {nav}</body></html>")}
    for i in range(PAGES):
        pages[f"/p{i}"] = html_page(f"<html><body>{label} page {i} {nav}</body></html>")
    return Site(pages)


def _served(delay_s: float) -> Served:
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=delay_s, response_factor=0.0))
    return Served(FrontierService(Frontier(MemoryStore(), WallClock(), config)))


@pytest.fixture
def web() -> Iterator[LocalWeb]:
    with LocalWeb({"a": _site("a"), "b": _site("b")}) as w:
        yield w


@pytest.mark.parametrize("delay_s", [0.0, 0.05])
def test_a_worker_crawl_drains_every_page_once_one_in_flight_per_host(web: LocalWeb, delay_s: float) -> None:
    served = _served(delay_s)
    try:
        with grpc.insecure_channel(served.address, options=grpc_options()) as channel:
            stub = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
            links = [pb.Link(observed=web.url(label, "/"), seed=True) for label in ("a", "b")]
            stub.Discover(pb.DiscoverRequest(links=links), timeout=RPC_S)

        async def crawl() -> Worker:
            worker = Worker(StaticRouter(served.address), Fetcher(NetworkPolicy(["127.0.0.0/8"]), UA), max_in_flight=8)
            try:
                await asyncio.wait_for(worker.run(asyncio.Event(), until_drained=True), 60)
            finally:
                await worker.close()
            return worker

        worker = asyncio.run(crawl())
    finally:
        served.close()
    pages = {(label, path) for label in ("a", "b") for path in ["/", *(f"/p{i}" for i in range(PAGES))]}
    assert {k for k in web.fetched() if k[1] != "/robots.txt"} == pages
    assert web.duplicates() == []
    assert worker.stats.fetched == len(web.hits) and worker.stats.in_flight == 0  # pages and robots files
    for label in ("a", "b"):
        assert web.max_concurrency(label) == 1
        assert politeness_violations(web, label, delay_s) == []


def test_items_leased_with_a_completion_after_the_run_stopped_are_handed_back() -> None:
    """A completion's reply that brings leases once the worker stopped taking work: each is completed as a
    hand-back (worker_shutdown) at once, so the node hands the page out again without waiting for the lease."""
    served = _served(0.0)
    try:
        with grpc.insecure_channel(served.address, options=grpc_options()) as channel:
            stub = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
            stub.Discover(pb.DiscoverRequest(links=seeds(1, 1)), timeout=RPC_S)

            async def scenario() -> None:
                worker = Worker(StaticRouter(served.address), Fetcher(NetworkPolicy([]), UA))
                try:
                    robots = stub.Lease(pb.LeaseRequest(worker_id=worker.worker_id, max_items=5), timeout=RPC_S).items
                    done = pb.CompleteRequest(lease_id=robots[0].lease_id, generation=robots[0].generation,
                                              outcome=pb.Outcome(status=404, retry_after_s=-1),
                                              worker_id=worker.worker_id)  # fmt: skip
                    request = pb.CompleteBatchRequest(completions=[done], worker_id=worker.worker_id, lease_max_items=5)
                    leased = stub.CompleteBatch(request, timeout=RPC_S).leases
                    assert [it.url for it in leased] == ["http://h0.example/p0"]
                    assert not stub.Lease(pb.LeaseRequest(worker_id="other", max_items=5), timeout=RPC_S).items
                    worker._take_leased(served.address, leased, 0)  # the run is not taking items
                    await asyncio.gather(*worker._handback)
                    assert worker.stats.in_flight == 0 and not worker._tasks
                finally:
                    await worker.close()

            asyncio.run(scenario())
            again = stub.Lease(pb.LeaseRequest(worker_id="other", max_items=5), timeout=RPC_S).items
            assert [it.url for it in again] == ["http://h0.example/p0"]
    finally:
        served.close()


def test_a_lease_that_ends_before_its_fetch_could_start_is_handed_back_unfetched(web: LocalWeb) -> None:
    """A worker whose loop was too busy to start a fetch until its lease nearly ended hands the item back instead of
    fetching: after expiry the node may give the host to another worker, and the late fetch could land beside
    that one (two requests at once, or a gap below the delay). The server sees no request; the page goes out again
    at once."""
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0), lease_s=1.0)
    served = Served(FrontierService(Frontier(MemoryStore(), WallClock(), config)))
    page = web.url("a", "/p0")
    try:
        with grpc.insecure_channel(served.address, options=grpc_options()) as channel:
            stub = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
            seed_past_robots(stub, page)

            async def scenario() -> Worker:
                worker = Worker(StaticRouter(served.address), Fetcher(NetworkPolicy(["127.0.0.0/8"]), UA))
                try:
                    items = stub.Lease(pb.LeaseRequest(worker_id=worker.worker_id, max_items=5), timeout=RPC_S).items
                    assert [it.url for it in items] == [page]
                    worker._spawn(served.address, items)
                    time.sleep(0.9)  # the loop is busy elsewhere: the task starts with 0.1 s of its lease left
                    await asyncio.gather(*worker._tasks)
                finally:
                    await worker.close()
                return worker

            worker = asyncio.run(scenario())
            assert worker.stats.late_starts == 1 and worker.stats.fetched == 0
            assert [h for h in web.hits if h.resource != "/robots.txt"] == []
            again = stub.Lease(pb.LeaseRequest(worker_id="other", max_items=5), timeout=RPC_S).items
            assert [it.url for it in again] == [page]  # handed back, not left to expire
    finally:
        served.close()
