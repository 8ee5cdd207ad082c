"""The core when a store call fails in the middle of an operation: a Redis server SIGKILLed and started again on
its append-only file while a cluster node's core asks the cluster-wide body index (a real redis-server).

A completion that cannot reach the body index must change nothing, so that the worker's retry settles it. (Before:
the lease was settled first, so the item stayed leased with no lease left to expire, its host never re-entered the
ready heap and its links were never admitted; the retry was answered unknown_lease and the node never drained.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from frontier_node.core.config import FrontierConfig, PolitenessConfig, RevisitConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.records import Item, Kind, Link, LinkLike, Outcome
from frontier_node.core.states import State
from frontier_node.store.memory import MemoryStore
from frontier_node.store.redis.bodies import RedisBodyIndex
from hostring.clock import VirtualClock
from hostring_testing.redis_server import RedisServer
from tests.store_helpers import lease_until

AOF = ("--appendonly", "yes", "--appendfsync", "always")
HOME = "http://a.example/"


class _Outbox:
    """Links for other nodes: none in these tests."""

    def forward(self, links: list[LinkLike]) -> None:
        raise AssertionError(f"no link leaves this node: {links}")

    def post(self, domain: str, message: object) -> None:
        raise AssertionError("no mail leaves this node")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[list[RedisServer]]:
    """A redis-server with an append-only file; the list holds the one running now (a test may restart it)."""
    (tmp_path / "redis").mkdir()
    running = [RedisServer(tmp_path / "redis", *AOF)]
    yield running
    running[0].stop()


def _restart(server: list[RedisServer], tmp_path: Path) -> None:
    old = server[0]
    server[0] = RedisServer(tmp_path / "redis", *AOF, port=old.port)


def _node(server: RedisServer, clock: VirtualClock, revisit: RevisitConfig | None = None) -> Frontier:
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=1.0), lease_s=10.0)
    if revisit is not None:
        config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=1.0), lease_s=10.0, revisit=revisit)
    f = Frontier(MemoryStore(), clock, config)
    f.attach_cluster(_Outbox(), RedisBodyIndex(redis.Redis.from_url(server.url), "faults"))
    return f


def _own_body(key: str) -> str:
    return "sha256:" + key


def _crawl_out(f: Frontier, clock: VirtualClock) -> None:
    for _ in range(10_000):
        if f.drained:
            return
        for it in f.lease("w", 10):
            outcome = Outcome(status=404) if it.kind is Kind.ROBOTS else Outcome(status=200, body_digest=it.key)
            f.complete(it.key, it.generation, outcome)
        clock.advance(0.5)
    raise AssertionError("the node never drained")


def _unchanged_by_a_failed_complete(f: Frontier, it: Item, outcome: Outcome, links: list[Link]) -> None:
    """The complete fails on the dead body index, and the lease, the counts and the host stay as they were."""
    before = f.stats()
    with pytest.raises(redis.ConnectionError):
        f.complete(it.key, it.generation, outcome, links)
    after = f.stats()
    assert f.leased_domain(it.key) == "a.example", "the lease was settled by a completion that failed"
    assert after.urls_by_state == before.urls_by_state and after.in_flight == before.in_flight == 1
    host = f.host("a.example")
    assert host is not None and host.in_flight == 1


def test_a_completion_that_cannot_reach_the_body_index_changes_nothing(
    server: list[RedisServer], tmp_path: Path
) -> None:
    clock = VirtualClock()
    f = _node(server[0], clock)
    f.discover([Link(HOME, seed=True)])
    it = lease_until(f, clock, HOME, _own_body, step=0.5)
    server[0].proc.kill()
    server[0].proc.wait(10)
    links = [Link(f"{HOME}p{i}", base_url=HOME, depth=1) for i in range(3)]
    outcome = Outcome(status=200, body_digest="sha256:home", simhash=0x1234_5678_9ABC_DEF0)
    _unchanged_by_a_failed_complete(f, it, outcome, links)

    _restart(server, tmp_path)
    done = f.complete(it.key, it.generation, outcome, links)  # the worker's retry
    assert (done.accepted, done.state, done.follow_links, done.admitted) == (True, "fetched", True, 3)
    _crawl_out(f, clock)
    for key in [HOME, *(link.observed for link in links)]:
        row = f.store.get(key)  # type: ignore[attr-defined]
        assert row is not None and row.state is State.FETCHED, (key, row)


def test_a_revisit_that_cannot_reach_the_body_index_changes_nothing(server: list[RedisServer], tmp_path: Path) -> None:
    clock = VirtualClock()
    f = _node(server[0], clock, RevisitConfig("fixed", 100.0, 10.0, 1000.0))
    f.discover([Link(HOME, seed=True)])
    it = lease_until(f, clock, HOME, _own_body, step=0.5)
    f.complete(it.key, it.generation, Outcome(status=200, body_digest="sha256:v1"))
    it = lease_until(f, clock, HOME, _own_body, step=0.5)
    assert it.checked_at > 0, "the second lease of the page is its revisit"
    server[0].proc.kill()
    server[0].proc.wait(10)
    links = [Link(f"{HOME}new", base_url=HOME, depth=1)]
    outcome = Outcome(status=200, body_digest="sha256:v2")  # a changed body: the index is asked for a mirror
    _unchanged_by_a_failed_complete(f, it, outcome, links)

    _restart(server, tmp_path)
    done = f.complete(it.key, it.generation, outcome, links)
    assert (done.accepted, done.reason, done.follow_links, done.admitted) == (True, "revisit:changed", True, 1)
