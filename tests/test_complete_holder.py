"""Only a lease's holder settles it: a completion naming another worker (or none) is refused like a stale one.

Lease ids are URLs and generations count from 1, so any client can name another worker's lease. A completion whose
worker_id is not the worker the lease was granted to changes nothing, is journaled as late evidence and is answered
accepted=false with reason "not_holder"; the holder's own completion then lands. In process (worker_id None) the
caller is the holder by construction and nothing is checked.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import NOT_HOLDER, Frontier, LeaseError
from frontier_node.core.records import Item, Kind, Link, Outcome
from frontier_node.core.states import State
from frontier_node.service import FrontierService
from frontier_node.store.memory import MemoryStore
from hostring.clock import VirtualClock, WallClock
from hostring.limits import grpc_options
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from tests.test_node_shell import RPC_S, Served, seeds

pytestmark = [pytest.mark.timeout(60)]

CONFIG = FrontierConfig(politeness=PolitenessConfig(min_delay_s=1.0), lease_s=10.0)
OK = Outcome(status=200, response_s=0.01, content_type="text/html")
GONE = Outcome(status=404)


# ============================================================================================== the core


def _leased_to_a(f: Frontier, clock: VirtualClock) -> Item:
    """The one page of one host, leased to worker "A" (its robots.txt answered 404 first)."""
    f.discover([Link("http://h.example/a")])
    clock.advance(2.0)
    (robots,) = f.lease("A", 5)
    assert robots.kind is Kind.ROBOTS
    assert f.complete(robots.key, robots.generation, Outcome(status=404), worker_id="A").accepted
    clock.advance(2.0)
    (page,) = f.lease("A", 5)
    return page


def _late_lines(store: MemoryStore, key: str) -> list[str]:
    store.flush()
    return [e.reason for e in store.journal() if e.key == key and e.event == "late_evidence"]


def test_core_a_completion_by_another_worker_changes_nothing_and_the_holders_lands() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = Frontier(store, clock, CONFIG)
    page = _leased_to_a(f, clock)
    key, generation = page.key, page.generation
    for who in ("B", ""):
        forged = f.complete(key, generation, GONE, [Link("http://h.example/forged", source_key=key)], worker_id=who)
        assert not forged.accepted and forged.reason == NOT_HOLDER and forged.state == "leased", (who, forged)
        assert forged.admitted == 0
    assert f.body_claim(key, generation, OK, worker_id="B") is None, "a forged body would be registered ahead"
    assert page.state is State.LEASED and f.leased_domain(key) == "h.example"
    assert f.stats().urls_by_state.get("scheduled", 0) == 0, "the forged completion's link was admitted"
    assert _late_lines(store, key) == ["not_holder worker='B' status=404", "not_holder worker='' status=404"]
    mine = f.complete(key, generation, OK, worker_id="A")
    assert mine.accepted and mine.state == "fetched", mine


def test_core_a_hand_back_must_come_from_the_holder() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = Frontier(store, clock, CONFIG)
    page = _leased_to_a(f, clock)
    back = Outcome(error_class="worker_shutdown", retry_after_s=-1)
    refused = f.complete(page.key, page.generation, back, worker_id="B")
    assert not refused.accepted and refused.reason == NOT_HOLDER and page.state is State.LEASED
    assert _late_lines(store, page.key) == ["not_holder worker='B' status=0 worker_shutdown"]
    handed = f.complete(page.key, page.generation, back, worker_id="A")
    assert handed.accepted and page.state is not State.LEASED


def test_core_in_process_callers_are_not_checked() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = Frontier(store, clock, CONFIG)
    page = _leased_to_a(f, clock)
    assert f.body_claim(page.key, page.generation, OK) is None  # no digest: nothing to claim, but not refused
    assert f.complete(page.key, page.generation, OK).accepted


# ============================================================================================== over gRPC


@pytest.fixture
def node() -> Iterator[tuple[pb_grpc.FrontierStub, MemoryStore]]:
    """A node on a MemoryStore (delay 0) served over loopback gRPC, and its store."""
    store = MemoryStore()
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0))
    served = Served(FrontierService(Frontier(store, WallClock(), config)))
    try:
        with grpc.insecure_channel(served.address, options=grpc_options()) as channel:
            yield pb_grpc.FrontierStub(channel), store  # type: ignore[no-untyped-call]
    finally:
        served.close()


def _done(item: pb.LeaseItem, outcome: pb.Outcome, worker_id: str, *links: pb.Link) -> pb.CompleteRequest:
    return pb.CompleteRequest(
        lease_id=item.lease_id, generation=item.generation, outcome=outcome, worker_id=worker_id, links=links
    )


def _pages_leased_to_a(stub: pb_grpc.FrontierStub, n: int) -> list[pb.LeaseItem]:
    """`n` pages of `n` hosts leased to worker "A" (their robots.txt answered 404 by "A" first)."""
    stub.Discover(pb.DiscoverRequest(links=seeds(n, n)), timeout=RPC_S)
    robots = stub.Lease(pb.LeaseRequest(worker_id="A", max_items=n), timeout=RPC_S).items
    assert len(robots) == n and all(it.kind == pb.ROBOTS for it in robots)
    gone = pb.Outcome(status=404, retry_after_s=-1)
    answers = stub.CompleteBatch(pb.CompleteBatchRequest(completions=[_done(it, gone, "A") for it in robots]))
    assert all(r.accepted for r in answers.results), answers
    pages = stub.Lease(pb.LeaseRequest(worker_id="A", max_items=n), timeout=RPC_S).items
    assert len(pages) == n and all(it.kind == pb.PAGE for it in pages)
    return sorted(pages, key=lambda it: it.url)


def _state(stub: pb_grpc.FrontierStub, url: str) -> str:
    return stub.GetUrl(pb.GetUrlRequest(url=url), timeout=RPC_S).state


def test_grpc_another_worker_cannot_settle_a_lease_and_the_holders_completion_lands(
    node: tuple[pb_grpc.FrontierStub, MemoryStore],
) -> None:
    stub, store = node
    (page,) = _pages_leased_to_a(stub, 1)
    forged_404 = pb.Outcome(status=404, retry_after_s=-1)
    for who in ("B", ""):
        forged = stub.Complete(_done(page, forged_404, who), timeout=RPC_S)
        assert not forged.accepted and forged.reason == NOT_HOLDER, (who, forged)
        assert _state(stub, page.url) == "leased"
    link = pb.Link(observed="http://h0.example/forged", source_key=page.lease_id)
    forged = stub.Complete(_done(page, pb.Outcome(status=200, retry_after_s=-1), "B", link), timeout=RPC_S)
    assert not forged.accepted and forged.reason == NOT_HOLDER and forged.admitted == 0
    assert _late_lines(store, page.lease_id) == [
        "not_holder worker='B' status=404",
        "not_holder worker='' status=404",
        "not_holder worker='B' status=200",
    ]
    back = stub.Complete(_done(page, pb.Outcome(error_class="worker_shutdown", retry_after_s=-1), "B"))
    assert not back.accepted and back.reason == NOT_HOLDER and _state(stub, page.url) == "leased"
    mine = stub.Complete(_done(page, pb.Outcome(status=200, retry_after_s=-1), "A"), timeout=RPC_S)
    assert mine.accepted and mine.state == "fetched", mine
    assert stub.Stats(pb.StatsRequest(), timeout=RPC_S).seen == 2, "the forged completion's link was admitted"


def test_grpc_one_forged_completion_in_a_batch_is_refused_alone(
    node: tuple[pb_grpc.FrontierStub, MemoryStore],
) -> None:
    stub, store = node
    first, second, third = _pages_leased_to_a(stub, 3)
    ok, gone = pb.Outcome(status=200, retry_after_s=-1), pb.Outcome(status=404, retry_after_s=-1)
    completions = [_done(first, ok, "A"), _done(second, gone, "B"), _done(third, ok, "A")]
    batch = pb.CompleteBatchRequest(completions=completions)
    honest, forged, other = stub.CompleteBatch(batch, timeout=RPC_S).results
    assert honest.accepted and other.accepted and honest.state == other.state == "fetched", (honest, other)
    assert not forged.accepted and forged.reason == NOT_HOLDER and forged.state == "leased", forged
    (alone,) = stub.CompleteBatch(pb.CompleteBatchRequest(completions=[_done(second, gone, "B")])).results
    assert not alone.accepted and alone.reason == NOT_HOLDER, alone
    assert _state(stub, second.url) == "leased"
    assert _late_lines(store, second.lease_id) == ["not_holder worker='B' status=404"] * 2
    mine = stub.CompleteBatch(pb.CompleteBatchRequest(completions=[_done(second, ok, "A")]), timeout=RPC_S)
    assert mine.results[0].accepted and mine.results[0].state == "fetched", mine


def test_core_only_the_holder_renews_a_lease() -> None:
    """A Renew naming another worker (or none) does not extend the lease, which then expires as its holder's would;
    the holder's own Renew extends it."""
    clock, store = VirtualClock(), MemoryStore()
    f = Frontier(store, clock, CONFIG)
    page = _leased_to_a(f, clock)
    for who in ("B", ""):
        with pytest.raises(LeaseError) as refused:
            f.renew(page.key, page.generation, 10.0, worker_id=who)
        assert refused.value.reason == NOT_HOLDER
        assert page.deadline == clock.now() + CONFIG.lease_s
    clock.advance(5.0)
    assert f.renew(page.key, page.generation, 10.0, worker_id="A") == clock.now() + CONFIG.lease_s


def test_grpc_another_worker_cannot_keep_a_lease_alive(node: tuple[pb_grpc.FrontierStub, MemoryStore]) -> None:
    stub, _ = node
    (page,) = _pages_leased_to_a(stub, 1)
    for who in ("B", ""):
        request = pb.RenewRequest(lease_id=page.lease_id, generation=page.generation, extend_ms=60_000, worker_id=who)
        forged = stub.Renew(request, timeout=RPC_S)
        assert not forged.ok and forged.reason == NOT_HOLDER, (who, forged)
    request = pb.RenewRequest(lease_id=page.lease_id, generation=page.generation, extend_ms=60_000, worker_id="A")
    mine = stub.Renew(request, timeout=RPC_S)
    assert mine.ok and mine.deadline_ms >= page.deadline_ms, mine
