"""Revisits together with what main gained beside them: leases handed back and refusals reconsidered (#13), and the
cluster-wide body index (#9). Every move is checked against the journal: replaying it gives the rows, revisit
numbers included.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from frontier_node.core.config import FrontierConfig, PolitenessConfig, RevisitConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.handback import HANDED_BACK
from frontier_node.core.journal import replay
from frontier_node.core.records import Kind, Link, LinkLike, Outcome
from frontier_node.core.states import TRANSITIONS, Event, State
from frontier_node.store.memory import MemoryStore
from frontier_node.store.redis.bodies import RedisBodyIndex
from hostring.clock import VirtualClock
from tests.store_helpers import lease_until

REVISIT_FIELDS = ("due_at", "checked_at", "stored_at", "interval_s", "visits", "changes", "watched_s", "changed_s")
REFUSED = Outcome(error_class="network_policy", error_detail="network policy refuses 'a' at 10.0.0.1: private")


def _frontier(store: MemoryStore, clock: VirtualClock, retention_s: float = 10_000.0) -> Frontier:
    revisit = RevisitConfig("fixed", 100.0, 10.0, 1000.0, retention_s=retention_s)
    return Frontier(store, clock, FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0), revisit=revisit))


def _digest(key: str) -> str:
    return "sha256:" + key.rsplit("/", 1)[1]


def _journal_agrees(store: MemoryStore) -> None:
    replayed = replay(store.journal())
    for row in store.items():
        again = replayed[row.key]
        assert again.state is row.state, row.key
        if row.kind is Kind.PAGE and row.checked_at and again.item is not None:
            assert tuple(getattr(again.item, f) for f in REVISIT_FIELDS) == tuple(
                getattr(row, f) for f in REVISIT_FIELDS
            ), row.key


def test_the_table_holds_the_edges_of_both_branches() -> None:
    edges = {e for (_, e) in TRANSITIONS}
    assert {Event.RELEASE, Event.RECONSIDER, Event.REVISIT, Event.REFETCH, Event.PRUNE} <= edges
    assert TRANSITIONS[(State.FETCHED, Event.REFETCH)] is State.FETCHED
    assert TRANSITIONS[(State.FAILED, Event.PRUNE)] is State.FAILED
    assert TRANSITIONS[(State.FAILED, Event.RECONSIDER)] is State.SCHEDULED


def test_revisits_handed_back_refetched_refused_pruned_and_reconsidered_replay_to_their_rows() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = _frontier(store, clock, retention_s=500.0)
    one, two = "http://a.example/one", "http://b.example/two"
    f.discover([Link(one), Link(two)])
    it = lease_until(f, clock, one, _digest)  # `two` is fetched on the way
    f.complete(it.key, it.generation, Outcome(status=200, body_digest=_digest(one), etag='"1"'))

    # a stopping worker hands a revisit back: scheduled again at once, and it still completes as a revisit
    it = lease_until(f, clock, one, _digest)
    assert it.checked_at > 0
    generation = it.generation
    done = f.complete(it.key, generation, Outcome(error_class=HANDED_BACK))
    assert (done.accepted, done.state, done.reason) == (True, "scheduled", HANDED_BACK)
    again = lease_until(f, clock, one, _digest, step=0.1)
    assert again.generation > generation
    done = f.complete(again.key, again.generation, Outcome(status=304))
    assert done.reason == "revisit:not_modified"
    row = store.get(one)
    assert row is not None and row.state is State.FETCHED and row.due_at == clock.now() + 100.0

    # an operator asks for it sooner
    key, state, due = f.refetch(one, clock.now() + 5.0)
    assert (key, state, due) == (one, "fetched", clock.now() + 5.0)

    # the other page's revisit is refused by the network policy: retired, its history kept for the retention period,
    # then cleared; the reason stays (the report counts it, and it is still a refusal a wider policy lifts)
    it = lease_until(f, clock, two, _digest)
    assert f.complete(it.key, it.generation, REFUSED).state == "failed"
    assert store.get(two).visits > 0  # type: ignore[union-attr]
    clock.advance(600.0)
    f.tick()
    row = store.get(two)
    assert row is not None and (row.state, row.reason, row.visits) == (State.FAILED, "network_policy", 0.0)
    assert store.history(two)[-1].event == "prune"

    # a run under a wider policy reconsiders it: it is fetched again, as a revisit of the stored copy
    assert f.reconsider(["network_policy"]) == {"network_policy": 1}
    it = lease_until(f, clock, two, _digest)
    done = f.complete(it.key, it.generation, Outcome(status=200, body_digest=_digest(two)))
    assert done.reason == "revisit:unchanged"
    row = store.get(two)
    assert row is not None and row.state is State.FETCHED and row.due_at > clock.now()

    events = {e.event for e in store.journal()}
    assert {"release", "refetch", "prune", "reconsider", "revisit"} <= events
    _journal_agrees(store)


class _Outbox:
    """Links for other nodes, kept (a cluster's store would leave them in the owners' inboxes)."""

    def __init__(self) -> None:
        self.links: list[LinkLike] = []

    def forward(self, links: Sequence[LinkLike]) -> None:
        self.links += links

    def post(self, domain: str, message: object) -> None:
        """No robots hops here."""


def test_a_revisit_whose_body_mirrors_another_nodes_page_is_not_followed(redis_url: str, redis_namespace: str) -> None:
    """The cluster-wide body index is asked through the core's port: a mirror fetched by another node counts."""
    client = redis.Redis.from_url(redis_url)
    clock = VirtualClock()
    a_store, b_store = MemoryStore(), MemoryStore()
    a = _frontier(a_store, clock)
    b = _frontier(b_store, clock)
    for node in (a, b):
        node.attach_cluster(_Outbox(), RedisBodyIndex(client, redis_namespace))
    page_a, page_b = "http://a.example/news", "http://b.example/story"
    a.discover([Link(page_a)])
    b.discover([Link(page_b)])
    it = lease_until(b, clock, page_b, _digest)  # node B fetches its page first: the body is claimed cluster-wide
    b.complete(it.key, it.generation, Outcome(status=200, body_digest="sha256:story"))
    it = lease_until(a, clock, page_a, _digest)
    assert a.complete(it.key, it.generation, Outcome(status=200, body_digest="sha256:news")).follow_links

    link = [Link("http://a.example/next", depth=1)]
    # the page now carries node B's body: a mirror, its links are not followed
    it = lease_until(a, clock, page_a, _digest)
    done = a.complete(it.key, it.generation, Outcome(status=200, body_digest="sha256:story"), link)
    assert (done.reason, done.follow_links, done.admitted) == ("revisit:changed", False, 0)
    it = lease_until(a, clock, page_a, _digest)  # a body of its own again: followed
    done = a.complete(it.key, it.generation, Outcome(status=200, body_digest="sha256:news-2"), link)
    assert (done.reason, done.follow_links, done.admitted) == ("revisit:changed", True, 1)

    index = RedisBodyIndex(client, redis_namespace)
    assert index.mirror_of("sha256:story", page_b) is None  # its own body is no mirror
    assert index.mirror_of("sha256:story", page_a) == page_b
    assert index.mirror_of("sha256:news-2", page_b) is None  # read-only: the revisit registered nothing
    assert index.claim("sha256:news-2", 0, page_b).first is None
