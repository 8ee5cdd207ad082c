"""The Scrapy plug-in's FrontierSession against real nodes over loopback gRPC, without Scrapy: leases ride back
with the completions (one call per page, not a Lease and a CompleteBatch), politeness holds, nothing is lost; and
when a cluster node is SIGKILLed while the session holds its leases, their renewals and completions go to the node
that adopts them as soon as the ring names it, and no page is fetched twice.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.service import FrontierService
from frontier_node.store.memory import MemoryStore
from hostring.clock import WallClock
from hostring.membership import RingWatcher
from hostring.scrapy.session import FrontierSession, Lease, StaticRing
from hostring.v1 import frontier_pb2 as pb
from hostring_testing.cluster import Cluster
from tests.test_cluster_faults import Complaints, sigkill_a_node_holding_leases
from tests.test_node_shell import Served, seeds

pytestmark = [pytest.mark.timeout(60)]

PAGES, HOSTS = 24, 3
NOT_FOUND = pb.Outcome(status=404, retry_after_s=-1)


class CountingService(FrontierService):
    """A node service that counts the data-plane calls it answers."""

    calls: collections.Counter[str]

    async def Lease(self, request: pb.LeaseRequest, context: Any) -> pb.LeaseResponse:
        self.calls["Lease"] += 1
        return await super().Lease(request, context)

    async def CompleteBatch(self, request: pb.CompleteBatchRequest, context: Any) -> pb.CompleteBatchResponse:
        self.calls["CompleteBatch"] += 1
        return await super().CompleteBatch(request, context)


@pytest.fixture
def node() -> Iterator[Served]:
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.05, response_factor=0.0))
    service = CountingService(Frontier(MemoryStore(), WallClock(), config))
    service.calls = collections.Counter()
    served = Served(service)
    yield served
    served.close()


async def _crawl(address: str) -> tuple[list[str], int]:
    """Lease every item of the node through a session that 'fetches' each in 10 ms (404, no links); the URLs
    fetched and the most requests one host ever had in flight at once."""
    fetched: list[str] = []
    in_flight: collections.Counter[str] = collections.Counter()
    most = 0
    session: FrontierSession

    async def fetch(lease: Lease) -> None:
        nonlocal most
        host = lease.item.host
        in_flight[host] += 1
        most = max(most, in_flight[host])
        await asyncio.sleep(0.01)
        in_flight[host] -= 1
        fetched.append(lease.item.url)
        await session.complete(lease, NOT_FOUND)

    session = FrontierSession(
        StaticRing([address]),
        worker_id="spider-1",
        capacity=8,
        on_lease=lambda lease: session.spawn(fetch(lease)),
        stat=lambda key, n: None,
        drain_grace_s=0.2,
    )

    def on_verdict(verdict: pb.LinkVerdict | None) -> None:
        assert verdict is not None and verdict.verdict == pb.ADMITTED

    for link in seeds(PAGES, HOSTS):
        session.discover(link, on_verdict)
    session.start()
    try:
        while session.busy or not session.finished():  # as the scheduler's has_pending_requests asks
            await asyncio.sleep(0.05)
    finally:
        await session.close()
    return fetched, most


def test_leases_ride_back_with_completions(node: Served) -> None:
    """24 pages on 3 hosts with a 50 ms delay: every page (and each host's robots.txt) is fetched exactly once,
    never two at once on a host, and the session needs about one call per item: the completions' calls bring the
    next leases back, so standalone Leases are few (without this, a Lease and a completion per item: 2x). A quarter
    more is allowed: on a loaded machine a completion's call can be answered before its host's delay is over, and
    the session then parks a standalone Lease (seen: 29 calls for 27 items at load 13)."""
    fetched, most = asyncio.run(_crawl(node.address))
    pages = sorted(u for u in fetched if not u.endswith("/robots.txt"))
    assert pages == sorted(link.observed for link in seeds(PAGES, HOSTS))
    assert len(fetched) == PAGES + HOSTS
    assert most == 1
    calls = node.service.calls  # type: ignore[attr-defined]
    items = PAGES + HOSTS
    assert calls["Lease"] + calls["CompleteBatch"] <= items + items // 4, calls
    assert calls["Lease"] <= items // 2, calls


def test_a_link_discovered_after_the_node_said_drained_keeps_the_session_going(node: Served) -> None:
    """The node has answered "drained" for the whole grace period (finished); then this process discovers a link.
    Once its Discover is answered the session is not finished (the node admitted work since it said drained), and
    the link's host is leased. (Before: a drained answer from before the Discover still counted, and a scheduler
    asking between the answer and the next poll was told the crawl was over, with the link left on the node.)"""

    async def run() -> tuple[bool, list[str]]:
        leased: list[str] = []
        session = FrontierSession(
            StaticRing([node.address]),
            worker_id="spider-1",
            capacity=4,
            on_lease=lambda lease: leased.append(lease.item.url),
            stat=lambda key, n: None,
            drain_grace_s=0.3,
        )
        session.start()
        try:
            await wait_until(session.finished, "the session to finish on an empty node")
            (link,) = seeds(1, 1)
            session.discover(link, lambda verdict: None)
            while session.busy:  # the Discover is out; the lease loop sleeps between drained answers meanwhile
                await asyncio.sleep(0.001)
            finished_after = session.finished()
            await wait_until(lambda: bool(leased), "the link's host to be leased")
        finally:
            await session.close()
        return finished_after, leased

    finished_after, leased = asyncio.run(run())
    assert not finished_after, "finished with a link just admitted on the node"
    assert leased == ["http://h0.example/robots.txt"], leased


async def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


_TROUBLE = ("hostring/renew/lost", "hostring/complete/unreachable", "hostring/complete/stale")


@contextlib.contextmanager
def _session_on(c: Cluster) -> Iterator[Complaints]:
    """A FrontierSession following the cluster's ring (as the plug-in with HOSTRING_COORDINATOR), in a thread of
    its own, downloading each leased item over HTTP and completing it with its status; yields what its stats say
    went wrong (leases lost, completions stale or not delivered)."""
    stats: collections.Counter[str] = collections.Counter()
    stop = threading.Event()
    started = threading.Event()

    async def run() -> None:
        watcher = RingWatcher(c.coordinator)
        await watcher.start(timeout=30)
        async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
            session: FrontierSession

            async def fetch(lease: Lease) -> None:
                response = await http.get(lease.item.url)
                robots = response.content if lease.item.kind == pb.ROBOTS else b""
                await session.complete(lease, pb.Outcome(status=response.status_code, robots_body=robots))

            session = FrontierSession(
                watcher,
                worker_id="spider-1",
                capacity=40,
                on_lease=lambda lease: session.spawn(fetch(lease)),
                stat=lambda key, n: stats.update({key: n}),
                lease_wait_s=0.5,
            )
            session.start()
            started.set()
            try:
                while not stop.is_set():
                    await asyncio.sleep(0.05)
            finally:
                await session.close()
                await watcher.close()

    thread = threading.Thread(target=asyncio.run, args=(run(),), name="frontier-session", daemon=True)
    thread.start()
    try:
        assert started.wait(30), "the session did not start"
        yield lambda: [f"{key}: {stats[key]}" for key in _TROUBLE if stats[key]]
    finally:
        stop.set()
        thread.join(30)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_leases_of_a_sigkilled_node_are_renewed_and_completed_at_its_successor(
    tmp_path: Path, empty_redis: str
) -> None:
    """The plug-in's session holds the leases of a cluster node that is SIGKILLed (see
    tests.test_cluster_faults.sigkill_a_node_holding_leases): the quick pages' completions and the slow pages'
    renewals go to the node that adopts the domain as soon as the ring names it, and it settles them under the
    generation the dead node granted; no page is fetched twice, no origin has two requests at once, no lease is
    lost or completed stale. (Before: a Renew kept going to the dead address until the lease expired at the
    successor, which leased the slow pages again while their first downloads went on.)"""
    sigkill_a_node_holding_leases(tmp_path, empty_redis, _session_on)
