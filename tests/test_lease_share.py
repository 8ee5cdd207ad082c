"""Workers share a small web: the host a completion frees goes to a waiting worker that holds fewer leases than
the completing one, not back to the completing one in its reply (else the first worker to lease keeps every host
and `hostring crawl --workers N` crawls with one). Run on a real core thread, ops queued as the gRPC shell does."""

from __future__ import annotations

import asyncio
import threading

from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.records import Item, Link
from frontier_node.core_thread import CoreThread
from frontier_node.ops import Complete, Discover, Lease
from frontier_node.store.memory import MemoryStore
from hostring.clock import WallClock
from hostring.v1 import frontier_pb2 as pb

NOT_FOUND = pb.Outcome(status=404, retry_after_s=-1)


def _done(item: Item, worker: str) -> pb.CompleteRequest:
    return pb.CompleteRequest(lease_id=item.key, generation=item.generation, outcome=NOT_FOUND, worker_id=worker)


def _run(scenario: object) -> None:
    """Run `scenario(core)` on a fresh core thread over two hosts of three pages each, delay 0."""
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0, response_factor=0.0))
    core = CoreThread(Frontier(MemoryStore(), WallClock(), config), threading.Condition()).start()

    async def go() -> None:
        await core.submit(Discover([Link(f"http://h{i % 2}.example/p{i}") for i in range(6)]))
        await scenario(core)  # type: ignore[operator]

    try:
        asyncio.run(asyncio.wait_for(go(), 20))
    finally:
        core.stop()


def _robots(leased: list[Item]) -> dict[str, Item]:
    assert all(it.url.endswith("/robots.txt") for it in leased), leased
    return {it.host: it for it in leased}


def test_a_waiting_worker_with_fewer_leases_gets_the_freed_host() -> None:
    async def scenario(core: CoreThread) -> None:
        robots = _robots((await core.submit(Lease("a", 5, 0.0))).items)
        assert sorted(robots) == ["h0.example", "h1.example"]
        waiting_b = core.submit(Lease("b", 5, 5.0))  # queued first: it waits when the completion runs
        done = Complete([_done(robots["h0.example"], "a")], None, ("a", 5))
        await core.submit(done)
        assert done.leased == [], "a holds h1 still and b holds nothing: h0 should go to b"
        got = (await waiting_b).items
        assert [it.host for it in got] == ["h0.example"] and not got[0].url.endswith("/robots.txt")
        # Nobody waits now: a's next completion brings h1's page back in its reply.
        done = Complete([_done(robots["h1.example"], "a")], None, ("a", 5))
        await core.submit(done)
        assert [it.host for it in done.leased] == ["h1.example"]

    _run(scenario)


def test_a_worker_that_waits_itself_gets_its_host_in_the_reply() -> None:
    async def scenario(core: CoreThread) -> None:
        robots = _robots((await core.submit(Lease("a", 5, 0.0))).items)
        waiting_a = core.submit(Lease("a", 5, 0.5))
        done = Complete([_done(robots["h0.example"], "a")], None, ("a", 5))
        await core.submit(done)
        assert [it.host for it in done.leased] == ["h0.example"], "one worker alone: the reply carries the host"
        assert (await waiting_a).items == [], "the waiting Lease found nothing else ready"

    _run(scenario)


def test_a_waiting_worker_that_holds_as_many_does_not_take_the_reply() -> None:
    async def scenario(core: CoreThread) -> None:
        a_robots = (await core.submit(Lease("a", 1, 0.0))).items
        b_robots = (await core.submit(Lease("b", 1, 0.0))).items
        assert len(a_robots) == len(b_robots) == 1
        waiting_b = core.submit(Lease("b", 5, 0.5))
        done = Complete([_done(a_robots[0], "a")], None, ("a", 5))
        await core.submit(done)
        # a holds none after its completion, b one: a's reply goes first and takes its host's next page.
        assert [it.host for it in done.leased] == [a_robots[0].host]
        assert (await waiting_b).items == []

    _run(scenario)
