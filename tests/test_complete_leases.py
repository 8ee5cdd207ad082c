"""CompleteBatch with lease_max_items (zero-wait turnaround), run for real: a node's gRPC service on loopback.

The released host's next URL comes back in the completion's reply when its politeness allows it, never while its
delay runs and never a second one in flight; a client that asks for nothing (every older one) gets nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest

from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.service import FrontierService
from frontier_node.store.memory import MemoryStore
from hostring.clock import WallClock
from hostring.limits import grpc_options
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from tests.test_node_shell import RPC_S, Served, seeds

pytestmark = [pytest.mark.timeout(60)]

NOT_FOUND = pb.Outcome(status=404, retry_after_s=-1)
PAGE_OK = pb.Outcome(status=200, retry_after_s=-1, content_type="text/html")


def _channel(delay_s: float) -> Iterator[grpc.Channel]:
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=delay_s, response_factor=0.0))
    served = Served(FrontierService(Frontier(MemoryStore(), WallClock(), config)))
    try:
        with grpc.insecure_channel(served.address, options=grpc_options()) as channel:
            yield channel
    finally:
        served.close()


def _stub(delay_s: float) -> Iterator[pb_grpc.FrontierStub]:
    for channel in _channel(delay_s):
        yield pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]


@pytest.fixture
def stub() -> Iterator[pb_grpc.FrontierStub]:
    yield from _stub(0.0)


@pytest.fixture
def slow_stub() -> Iterator[pb_grpc.FrontierStub]:
    yield from _stub(30.0)


def done(item: pb.LeaseItem, outcome: pb.Outcome) -> pb.CompleteRequest:
    return pb.CompleteRequest(lease_id=item.lease_id, generation=item.generation, outcome=outcome, worker_id="w")


@pytest.fixture
def paced_stub() -> Iterator[pb_grpc.FrontierStub]:
    yield from _stub(0.3)


def batch(
    stub: pb_grpc.FrontierStub, *completions: pb.CompleteRequest, want: int = 0, wait_ms: int = 0
) -> pb.CompleteBatchResponse:
    request = pb.CompleteBatchRequest(
        completions=completions, worker_id="w" if want else "", lease_max_items=want, lease_wait_ms=wait_ms
    )
    return stub.CompleteBatch(request, timeout=RPC_S)


def test_each_completion_brings_back_its_hosts_next_url_one_at_a_time(stub: pb_grpc.FrontierStub) -> None:
    """Three pages of one host, delay 0: every completion's reply carries the host's next URL (asked for five:
    one, since one request is in flight per host), until the host has none left."""
    stub.Discover(pb.DiscoverRequest(links=seeds(3, 1)), timeout=RPC_S)
    (robots,) = stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=RPC_S).items
    assert robots.kind == pb.ROBOTS
    current, seen = robots, []
    outcome = NOT_FOUND
    for _ in range(3):
        resp = batch(stub, done(current, outcome), want=5)
        assert resp.results[0].accepted
        (current,) = resp.leases
        assert current.kind == pb.PAGE and current.host == "h0.example"
        seen.append(current.url)
        outcome = PAGE_OK
        # while it is leased, nothing else of the host goes out
        assert not stub.Lease(pb.LeaseRequest(worker_id="x", max_items=5), timeout=RPC_S).items
    assert sorted(seen) == [f"http://h0.example/p{i}" for i in range(3)]
    last = batch(stub, done(current, PAGE_OK), want=5)
    assert last.results[0].accepted and not last.leases
    assert stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=RPC_S).drained


def test_no_lease_while_the_hosts_delay_runs_but_other_ready_hosts_come(slow_stub: pb_grpc.FrontierStub) -> None:
    """With a 30 s delay the released host's next URL is not handed out by the completion (nor by a Lease); a
    host that is ready is."""
    stub = slow_stub
    stub.Discover(pb.DiscoverRequest(links=seeds(4, 2)), timeout=RPC_S)
    robots = stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=RPC_S).items
    assert sorted(it.host for it in robots) == ["h0.example", "h1.example"]
    first = next(it for it in robots if it.host == "h0.example")
    other = next(it for it in robots if it.host == "h1.example")
    resp = batch(stub, done(first, NOT_FOUND), want=5)
    assert resp.results[0].accepted and not resp.leases, "h0's page went out before its delay"
    assert not stub.Lease(pb.LeaseRequest(worker_id="x", max_items=5), timeout=RPC_S).items
    resp = batch(stub, done(other, NOT_FOUND), want=5)
    assert not resp.leases, "h1's delay runs from its robots.txt too"


def test_a_client_that_asks_for_no_leases_gets_none(stub: pb_grpc.FrontierStub) -> None:
    """An older client's CompleteBatch (no lease_max_items) settles as before and leases nothing: the page stays
    for the next Lease."""
    stub.Discover(pb.DiscoverRequest(links=seeds(1, 1)), timeout=RPC_S)
    (robots,) = stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=RPC_S).items
    resp = batch(stub, done(robots, NOT_FOUND))
    assert resp.results[0].accepted and not resp.leases
    (page,) = stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=RPC_S).items
    assert page.url == "http://h0.example/p0"


def test_lease_fields_are_checked(stub: pb_grpc.FrontierStub) -> None:
    """lease_max_items needs a worker id and stays within the Lease cap; a refused call settles nothing."""
    stub.Discover(pb.DiscoverRequest(links=seeds(1, 1)), timeout=RPC_S)
    (robots,) = stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=RPC_S).items
    bad = [
        pb.CompleteBatchRequest(completions=[done(robots, NOT_FOUND)], lease_max_items=3),
        pb.CompleteBatchRequest(completions=[done(robots, NOT_FOUND)], worker_id="w", lease_max_items=1_001),
        pb.CompleteBatchRequest(completions=[done(robots, NOT_FOUND)], worker_id="w\x00", lease_max_items=1),
        pb.CompleteBatchRequest(
            completions=[done(robots, NOT_FOUND)], worker_id="w", lease_max_items=1, lease_wait_ms=30_001
        ),
    ]
    for request in bad:
        with pytest.raises(grpc.RpcError) as e:
            stub.CompleteBatch(request, timeout=RPC_S)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        assert "CompleteBatchRequest." in (e.value.details() or "")
    resp = batch(stub, done(robots, NOT_FOUND), want=1)
    assert resp.results[0].accepted, "a refused call settled the lease"
    (page,) = resp.leases
    assert page.url == "http://h0.example/p0"


def test_a_batch_that_may_wait_brings_back_the_hosts_next_url_once_its_delay_ends(
    paced_stub: pb_grpc.FrontierStub,
) -> None:
    """lease_wait_ms: the completion releases its host into a 0.3 s delay; instead of answering with no lease (as
    without a wait), the call waits on the node and brings the host's next URL, leased to the worker. Meanwhile no
    other worker gets that host."""
    stub = paced_stub
    stub.Discover(pb.DiscoverRequest(links=seeds(2, 1)), timeout=RPC_S)
    (robots,) = stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=RPC_S).items
    resp = batch(stub, done(robots, NOT_FOUND), want=5)
    assert resp.results[0].accepted and not resp.leases, "the delay should run after robots.txt"
    (page,) = stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5, wait_ms=10_000), timeout=RPC_S).items
    resp = batch(stub, done(page, PAGE_OK), want=5, wait_ms=10_000)
    assert resp.results[0].accepted and resp.results[0].state == "fetched"
    (second,) = resp.leases
    assert second.host == "h0.example" and second.url != page.url
    assert not stub.Lease(pb.LeaseRequest(worker_id="x", max_items=5), timeout=RPC_S).items, "two in flight"


def test_a_waiting_batch_is_answered_at_once_when_the_node_has_nothing_left(stub: pb_grpc.FrontierStub) -> None:
    """The last page's completion asks to wait 30 s for more: the node drained, so it answers at once (well within
    the call's deadline, which is shorter than the wait) with the result and no lease."""
    stub.Discover(pb.DiscoverRequest(links=seeds(1, 1)), timeout=RPC_S)
    (robots,) = stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=RPC_S).items
    (page,) = batch(stub, done(robots, NOT_FOUND), want=5).leases
    assert RPC_S < 30
    resp = batch(stub, done(page, PAGE_OK), want=5, wait_ms=30_000)
    assert resp.results[0].accepted and not resp.leases
    assert stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=RPC_S).drained


def test_completions_are_committed_before_the_wait(slow_stub: pb_grpc.FrontierStub) -> None:
    """A client that gives up on a waiting batch (its deadline passes during the 30 s delay) has still completed
    its pages: the same completion sent again is stale, and the page is fetched."""
    stub = slow_stub
    stub.Discover(pb.DiscoverRequest(links=seeds(2, 1)), timeout=RPC_S)
    (robots,) = stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=RPC_S).items
    request = pb.CompleteBatchRequest(
        completions=[done(robots, NOT_FOUND)], worker_id="w", lease_max_items=5, lease_wait_ms=30_000
    )
    with pytest.raises(grpc.RpcError) as e:
        stub.CompleteBatch(request, timeout=1.0)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    again = batch(stub, done(robots, NOT_FOUND))
    assert again.results[0].reason == "already_settled", "the completion was not committed before the wait"
    info = stub.GetUrl(pb.GetUrlRequest(url=robots.fetch_key), timeout=RPC_S)
    assert info.state == "fetched"


# ============================================================================ CompleteStream


@pytest.fixture
def second_stub() -> Iterator[pb_grpc.FrontierStub]:
    yield from _stub(1.0)


def test_a_stream_answers_each_batch_by_its_tag_as_soon_as_it_is_ready(second_stub: pb_grpc.FrontierStub) -> None:
    """Two batches on one CompleteStream: the first waits for a lease (its host rests 1 s, the other is in
    flight), the second asks for none: the second is answered first, each with its own tag, and the first then
    brings the host's page."""
    stub = second_stub
    stub.Discover(pb.DiscoverRequest(links=seeds(2, 2)), timeout=RPC_S)
    robots = stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=RPC_S).items
    first = next(it for it in robots if it.host == "h0.example")
    other = next(it for it in robots if it.host == "h1.example")
    waits = pb.CompleteBatchRequest(
        completions=[done(first, NOT_FOUND)], worker_id="w", lease_max_items=1, lease_wait_ms=10_000, tag=7
    )
    quick = pb.CompleteBatchRequest(completions=[done(other, NOT_FOUND)], tag=8)
    answers = list(stub.CompleteStream(iter([waits, quick]), timeout=RPC_S))
    assert [a.tag for a in answers] == [8, 7]
    assert all(a.results[0].accepted for a in answers)
    assert not answers[0].leases
    (page,) = answers[1].leases
    assert page.host in ("h0.example", "h1.example") and page.kind == pb.PAGE


@pytest.fixture
def channel() -> Iterator[grpc.Channel]:
    yield from _channel(0.0)


def test_a_refused_or_undecodable_message_ends_the_stream_with_the_calls_status(channel: grpc.Channel) -> None:
    """A message CompleteBatch would refuse (leases asked without a worker id) ends the stream INVALID_ARGUMENT,
    naming the field; so do bytes that are not a CompleteBatchRequest."""
    stub = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
    stub.Discover(pb.DiscoverRequest(links=seeds(1, 1)), timeout=RPC_S)
    (robots,) = stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=RPC_S).items
    bad = pb.CompleteBatchRequest(completions=[done(robots, NOT_FOUND)], lease_max_items=3, tag=1)
    with pytest.raises(grpc.RpcError) as e:
        list(stub.CompleteStream(iter([bad]), timeout=RPC_S))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "CompleteBatchRequest.worker_id" in (e.value.details() or "")
    raw = channel.stream_stream(
        "/hostring.v1.Frontier/CompleteStream", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    with pytest.raises(grpc.RpcError) as e:
        list(raw(iter([b"\xff\xff\xff"]), timeout=RPC_S))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid hostring.v1.CompleteBatchRequest" in (e.value.details() or "")
    resp = batch(stub, done(robots, NOT_FOUND))
    assert resp.results[0].accepted, "a refused stream settled the lease"


def test_an_unexpected_error_ends_the_stream_as_it_ends_the_call() -> None:
    """A message whose CompleteBatch fails unexpectedly ends the stream UNKNOWN, as it would end its call, while the
    client still holds the stream open: no answer left owed and waited for until the deadline."""
    service = FrontierService(Frontier(MemoryStore(), WallClock(), FrontierConfig()))
    served = Served(service)
    complete_batch = service.CompleteBatch

    async def failing(request: pb.CompleteBatchRequest, context: object) -> pb.CompleteBatchResponse:
        if request.tag == 2:
            raise RuntimeError("unexpected")
        return await complete_batch(request, context)  # type: ignore[arg-type]

    service.CompleteBatch = failing  # type: ignore[method-assign]
    release = threading.Event()

    def batches() -> Iterator[pb.CompleteBatchRequest]:
        yield from (pb.CompleteBatchRequest(tag=1), pb.CompleteBatchRequest(tag=2))
        release.wait(2 * RPC_S)  # no half-close

    try:
        with grpc.insecure_channel(served.address, options=grpc_options()) as channel:
            stub = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as e:
                list(stub.CompleteStream(batches(), timeout=RPC_S))
            assert e.value.code() == grpc.StatusCode.UNKNOWN, e.value
    finally:
        release.set()
        served.close()
