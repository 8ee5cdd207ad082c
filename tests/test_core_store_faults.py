"""The core when a store call fails in the middle of an operation: a Redis server SIGKILLed and started again on
its append-only file while a node's core asks it something (a real redis-server): the cluster-wide body index, or
the node's own store for the queue a completion drains (a host given up, an origin abandoned).

A completion that cannot reach them must change nothing, so that the worker's retry settles it. (Before: the lease
was settled first, so the item stayed leased with no lease left to expire, its host never re-entered the ready heap
and its links were never admitted; the retry was answered unknown_lease and the node never drained.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from frontier_node.core.config import FrontierConfig, PolitenessConfig, RetryConfig, RevisitConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.records import Item, Kind, Link, LinkLike, Outcome
from frontier_node.core.states import State
from frontier_node.store.memory import MemoryStore
from frontier_node.store.redis import RedisStore
from frontier_node.store.redis.bodies import RedisBodyIndex
from hostring.clock import VirtualClock
from hostring.urls import ROBOTS_PREFIX
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


class _Posts:
    """An outbox that keeps the messages posted to other nodes (robots.txt hops); no link leaves this node."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, dict[str, object]]] = []

    def forward(self, links: list[LinkLike]) -> None:
        raise AssertionError(f"no link leaves this node: {links}")

    def post(self, domain: str, message: dict[str, object]) -> None:
        self.posted.append((domain, dict(message)))


def _store_node(server: RedisServer, clock: VirtualClock, owns: Callable[[str], bool] | None = None) -> Frontier:
    """A node whose store is the Redis server: each host keeps two queued URLs in RAM and the rest there (so a
    drain reads them back), a host is given up at its first failure and an item fails at its third attempt,
    expiries included."""
    politeness = PolitenessConfig(min_delay_s=1.0, give_up_after=1)
    retry = RetryConfig(max_attempts=3, max_expiries=0)
    config = FrontierConfig(politeness=politeness, retry=retry, lease_s=10.0, window=2, admission_window=2)
    return Frontier(RedisStore(redis.Redis.from_url(server.url), node_id="n1", epoch=1), clock, config, owns=owns)


def _discover_a_queue(f: Frontier) -> list[str]:
    """The home page and six more of a.example, most of them queued in the store only; their keys."""
    links = [Link(HOME, seed=True), *(Link(f"{HOME}q{i}", base_url=HOME, depth=1) for i in range(6))]
    f.discover(links)
    f.store.flush()
    host = f.host("a.example")
    assert host is not None and host.queued == 7
    return [link.observed for link in links]


def _kill(server: list[RedisServer]) -> None:
    server[0].proc.kill()
    server[0].proc.wait(10)


def test_a_completion_that_gives_up_a_host_it_cannot_read_the_queue_of_changes_nothing(
    server: list[RedisServer], tmp_path: Path
) -> None:
    """A failure that gives the host up suppresses its queue, whose tail lives in the store: that read comes first."""
    clock = VirtualClock()
    f = _store_node(server[0], clock)
    keys = _discover_a_queue(f)
    it = lease_until(f, clock, HOME, _own_body, step=0.5)
    f.store.flush()
    _kill(server)
    outcome = Outcome(status=503)
    _unchanged_by_a_failed_complete(f, it, outcome, [])

    _restart(server, tmp_path)
    done = f.complete(it.key, it.generation, outcome)  # the worker's retry
    assert (done.accepted, done.state) == (True, "failed")
    f.store.flush()
    rows = {key: f.store.get(key) for key in keys}  # type: ignore[attr-defined]
    assert {k: (r.state, r.reason) for k, r in rows.items() if r is not None} == {
        HOME: (State.FAILED, "host_unreachable:http_503"),
        **{k: (State.SUPPRESSED, "host_unreachable:http_503") for k in keys[1:]},
    }
    assert f.drained


def test_a_robots_failure_that_abandons_an_origin_it_cannot_read_the_queue_of_changes_nothing(
    server: list[RedisServer], tmp_path: Path
) -> None:
    """A robots.txt refused for good abandons its origin, whose queue's tail lives in the store: read first too."""
    clock = VirtualClock()
    f = _store_node(server[0], clock)
    keys = _discover_a_queue(f)
    (robots,) = f.lease("w", 10)
    assert robots.kind is Kind.ROBOTS
    f.store.flush()
    _kill(server)
    outcome = Outcome(error_class="network_policy")  # final: the origin is abandoned
    _unchanged_by_a_failed_complete(f, robots, outcome, [])

    _restart(server, tmp_path)
    done = f.complete(robots.key, robots.generation, outcome)
    assert (done.accepted, done.state) == (True, "failed")
    f.store.flush()
    rows = [f.store.get(key) for key in keys]  # type: ignore[attr-defined]
    assert [(r.state, r.reason) for r in rows if r is not None] == [(State.SUPPRESSED, "network_policy")] * 7
    assert f.drained


def test_a_robots_result_from_another_node_that_abandons_an_origin_it_cannot_read_the_queue_of_changes_nothing(
    server: list[RedisServer], tmp_path: Path
) -> None:
    """A robots.txt that redirected to another node's host comes back by mail, refused for good: the home node
    abandons the origin, whose queue's tail lives in the store. Read first: a failed read leaves the item leased
    and the mail unread (it is read again)."""
    clock = VirtualClock()
    f = _store_node(server[0], clock, owns=lambda domain: domain == "a.example")
    posts = _Posts()
    f.attach_cluster(posts)
    keys = _discover_a_queue(f)
    (robots,) = f.lease("w", 10)
    f.complete(robots.key, robots.generation, Outcome(status=301, location="http://b.example/robots.txt"))
    f.store.flush()
    ((domain, hop),) = posts.posted
    assert domain == "b.example" and hop["t"] == "robots_hop"
    result = {"t": "robots_result", "key": ROBOTS_PREFIX + "http://a.example", "gen": hop["gen"], "status": 0,
              "error_class": "network_policy", "retry_after_s": -1, "evidence": "", "url": str(hop["url"]),
              "body": ""}  # fmt: skip
    _kill(server)
    before = f.stats()
    with pytest.raises(redis.ConnectionError):
        f.robots_mail(result)
    assert f.leased_domain(robots.key) == "a.example", "the mail settled the robots item and then failed"
    assert f.stats().urls_by_state == before.urls_by_state and f.stats().in_flight == before.in_flight == 1

    _restart(server, tmp_path)
    f.robots_mail(result)  # the mail, read again
    f.store.flush()
    assert f.leased_domain(robots.key) is None
    rows = [f.store.get(key) for key in keys]  # type: ignore[attr-defined]
    assert [(r.state, r.reason) for r in rows if r is not None] == [(State.SUPPRESSED, "network_policy")] * 7


def test_a_robots_lease_expiring_for_good_whose_origin_queue_cannot_be_read_changes_nothing(
    server: list[RedisServer], tmp_path: Path
) -> None:
    """A robots.txt whose lease expires once too often fails and abandons its origin (its pages would wait for it
    forever), whose queue's tail lives in the store: the tick reads it before it takes the lease back."""
    clock = VirtualClock()
    f = _store_node(server[0], clock)
    keys = _discover_a_queue(f)
    for attempt in (1, 2, 3):  # never completed: each lease runs out (and the host rests a delay after it)
        robots = lease_until(f, clock, ROBOTS_PREFIX + "http://a.example", _own_body, step=0.5)
        assert robots.attempt == attempt
        clock.advance(11.0)
    f.store.flush()
    _kill(server)
    before = f.stats()
    with pytest.raises(redis.ConnectionError):
        f.tick()
    assert f.leased_domain(robots.key) == "a.example", "the lease was taken back by a tick that failed"
    assert f.stats().urls_by_state == before.urls_by_state and f.stats().in_flight == before.in_flight == 1

    _restart(server, tmp_path)
    f.tick()
    f.store.flush()
    assert f.leased_domain(robots.key) is None
    rows = [f.store.get(key) for key in keys]  # type: ignore[attr-defined]
    assert [(r.state, r.reason) for r in rows if r is not None] == [(State.SUPPRESSED, "robots_unavailable")] * 7
    assert f.drained
