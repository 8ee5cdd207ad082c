"""A big robots.txt is parsed off the core thread: `robots.prepare` parses it ahead (the node's shell calls it on a
worker thread), the record the core then makes of the same body takes the parsed group, and a hostile 500 KB file
no longer holds every other call of the node while it is parsed (about a second)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import pytest
from protego import Protego

from frontier_node.core import robots
from frontier_node.core.robots import RobotsPolicy, RobotsVerdict
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from tests.test_node_shell import RPC_S, memory_node, seeds

pytestmark = [pytest.mark.timeout(60)]


def _hostile(size: int = 490_000) -> bytes:
    """A robots.txt of many distinct wildcard rules, as big as a node parses (RFC 9309: at least 500 KiB)."""
    rng = random.Random(7)
    lines = ["User-agent: *", "Disallow: /private/"]
    while sum(len(line) + 1 for line in lines) < size:
        lines.append("Disallow: /" + "".join(rng.choice("abcdefgh*$") for _ in range(rng.randint(5, 30))))
    return "\n".join(lines).encode()


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts protego parses (a list that grows by one per parse)."""
    calls: list[int] = []
    parse = Protego.parse

    def counted(content: str) -> Protego:
        calls.append(1)
        return parse(content)

    monkeypatch.setattr(Protego, "parse", staticmethod(counted))
    return calls


def test_a_prepared_body_is_parsed_once_and_taken_once(parses: list[int]) -> None:
    policy = RobotsPolicy("hostring/0.1")
    body = b"User-agent: *\nDisallow: /private/\n" + b"# padding\n" * 3000
    robots.prepare(body, policy.product_token)
    assert len(parses) == 1
    record = policy.from_outcome("http://a.example", status=200, body=body, error_class="", now=0.0)
    assert len(parses) == 1, "the record parsed the body again"
    assert record.verdict is RobotsVerdict.RULES
    assert not record.allowed("http://a.example/private/x") and record.allowed("http://a.example/public")
    again = policy.from_outcome("http://a.example", status=200, body=body, error_class="", now=0.0)
    assert len(parses) == 2, "a prepared group is taken once"
    assert not again.allowed("http://a.example/private/x")
    robots.prepare(body, "otherbot")
    policy.from_outcome("http://a.example", status=200, body=body, error_class="", now=0.0)
    assert len(parses) == 4, "a group prepared for another product token answered this one"


def test_prepared_groups_are_bounded(parses: list[int]) -> None:
    policy = RobotsPolicy("hostring/0.1")
    bodies = [b"User-agent: *\nDisallow: /%d/\n" % n for n in range(robots.PREPARED_MAX + 3)]
    for body in bodies:
        robots.prepare(body, policy.product_token)
    start = len(parses)
    for body in bodies:
        policy.from_outcome("http://a.example", status=200, body=body, error_class="", now=0.0)
    assert len(parses) - start == 3, "the oldest prepared groups beyond the bound should have been dropped"


@pytest.fixture
def stub() -> Iterator[pb_grpc.FrontierStub]:
    with memory_node() as stub:
        yield stub


def test_the_node_answers_other_calls_while_a_hostile_robots_txt_is_parsed(stub: pb_grpc.FrontierStub) -> None:
    stub.Discover(pb.DiscoverRequest(links=seeds(2, 1)), timeout=RPC_S)
    (item,) = stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=RPC_S).items
    assert item.kind == pb.ROBOTS
    outcome = pb.Outcome(status=200, retry_after_s=-1, robots_body=_hostile())
    request = pb.CompleteRequest(lease_id=item.lease_id, generation=item.generation, outcome=outcome, worker_id="w")
    finished = threading.Event()
    completing = stub.Complete.future(request, timeout=30)
    completing.add_done_callback(lambda f: finished.set())
    time.sleep(0.05)  # the completion is on the node: checked, then its body parsed (about a second)
    stub.Discover(pb.DiscoverRequest(links=seeds(3, 3, "other")), timeout=RPC_S)
    assert not finished.is_set(), "a Discover waited for the hostile robots.txt to be parsed"
    assert completing.result().accepted
    info = stub.GetHost(pb.GetHostRequest(host=item.host), timeout=RPC_S)
    assert "rules" in info.robots, info


def test_only_the_holders_body_is_parsed_and_only_once(stub: pb_grpc.FrontierStub, parses: list[int]) -> None:
    """A forged completion (another worker's id) with a big robots.txt costs the node no parse; the holder's is
    parsed once, ahead on a worker thread, and the core takes that parse."""
    stub.Discover(pb.DiscoverRequest(links=seeds(1, 1)), timeout=RPC_S)
    (item,) = stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=RPC_S).items
    outcome = pb.Outcome(status=200, retry_after_s=-1, robots_body=_hostile(40_000))

    def batch(worker: str) -> pb.CompleteBatchRequest:
        done = pb.CompleteRequest(lease_id=item.lease_id, generation=item.generation, outcome=outcome, worker_id=worker)
        return pb.CompleteBatchRequest(completions=[done])

    (forged,) = stub.CompleteBatch(batch("x"), timeout=RPC_S).results
    assert not forged.accepted and not parses, "a forged completion's robots.txt was parsed"
    (mine,) = stub.CompleteBatch(batch("w"), timeout=RPC_S).results
    assert mine.accepted and len(parses) == 1, parses
