"""hostring.client.CompletionStream against a real node over loopback: batches answered by tag, and a node that goes
away fails every waiting batch with an RPC error (the caller retries) instead of leaving it hanging. A write the
transport refuses is played by a call of the test's own (when grpc.aio refuses one depends on timing)."""

from __future__ import annotations

import asyncio
import gc
import signal
from pathlib import Path

import grpc
import pytest

from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.service import FrontierService
from frontier_node.store.memory import MemoryStore
from hostring.client import CompletionBatcher, CompletionStream, NodeClients
from hostring.clock import WallClock
from hostring.scrapy.session import StaticRing
from hostring.v1 import frontier_pb2 as pb
from tests.test_node_shell import Node, Served, seeds

pytestmark = [pytest.mark.timeout(60)]

NOT_FOUND = pb.Outcome(status=404, retry_after_s=-1)


def _served(delay_s: float) -> Served:
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=delay_s, response_factor=0.0))
    return Served(FrontierService(Frontier(MemoryStore(), WallClock(), config)))


def _done(item: pb.LeaseItem) -> pb.CompleteRequest:
    return pb.CompleteRequest(lease_id=item.lease_id, generation=item.generation, outcome=NOT_FOUND, worker_id="w")


def test_batches_on_the_stream_get_their_own_answers() -> None:
    """Three hosts' robots.txt completed as three concurrent batches on one stream: each future gets the answer for
    its own completion (accepted, its state), and the stream stays whole."""
    served = _served(0.0)
    try:

        async def go() -> None:
            clients = NodeClients(StaticRing([served.address]), worker_id="w")
            stub = clients.stub(served.address)
            await stub.Discover(pb.DiscoverRequest(links=seeds(3, 3)), timeout=5)
            robots = (await stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=5)).items
            assert len(robots) == 3
            batcher = CompletionBatcher(clients, stream=True)
            answers = await asyncio.gather(*(batcher.submit(served.address, _done(item)) for item in robots))
            assert all(a.accepted for a in answers)
            again = await batcher.submit(served.address, _done(robots[0]))
            assert again.accepted and again.reason == "already_settled", "a repeat is answered as the first was"
            other = _done(robots[1])
            other.generation += 1
            stale = await batcher.submit(served.address, other)
            assert not stale.accepted, "a completion of a generation never leased is stale"
            assert batcher._streams[served.address].broken is None
            batcher.close()
            await clients.close()

        asyncio.run(go())
    finally:
        served.close()


def test_a_node_killed_mid_wait_fails_the_waiting_batch(tmp_path: Path) -> None:
    """A batch waits on the stream for a lease (its host rests 30 s) when the node process is killed (SIGKILL): the
    batch's future fails with an RPC error, not a hang, and the stream is marked broken (the next batch opens a new
    one)."""
    node = Node(tmp_path, "--delay", "30")
    try:

        async def go() -> None:
            clients = NodeClients(StaticRing([node.address]), worker_id="w")
            stub = clients.stub(node.address)
            await stub.Discover(pb.DiscoverRequest(links=seeds(2, 1)), timeout=5)
            (robots,) = (await stub.Lease(pb.LeaseRequest(worker_id="w", max_items=5), timeout=5)).items
            batcher = CompletionBatcher(
                clients,
                want=lambda address, n: 1,
                leased=lambda address, items, asked: None,
                lease_wait_ms=30_000,
                stream=True,
            )
            waiting = batcher.submit(node.address, _done(robots))
            await asyncio.sleep(1.0)
            assert not waiting.done(), "answered although its host rests 30 s"
            node.proc.send(signal.SIGKILL)
            with pytest.raises(grpc.aio.AioRpcError):
                await asyncio.wait_for(waiting, 10)
            assert batcher._streams[node.address].broken is not None
            batcher.close()
            await clients.close()

        asyncio.run(go())
    finally:
        node.close()


class _RefusingCall:
    """A CompleteStream call whose transport is gone: every write fails UNAVAILABLE, as grpc.aio's does once the
    connection is refused; the read waits until the call is cancelled."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def write(self, request: object) -> None:
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "refused")

    async def read(self) -> object:
        await self.cancelled.wait()
        raise asyncio.CancelledError

    def cancel(self) -> None:
        self.cancelled.set()


def test_a_batch_whose_write_fails_loses_no_future() -> None:
    """A batch whose write on the stream fails (the node died before the worker wrote to it): the caller gets the
    RPC error, the stream is broken, and no future is left with an exception nobody retrieves (a worker whose node
    died logged "Future exception was never retrieved" with the whole RPC error for each such batch)."""

    class Stub:
        def CompleteStream(self) -> _RefusingCall:
            return _RefusingCall()

    async def go() -> None:
        lost: list[str] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: lost.append(str(context.get("message"))))
        stream = CompletionStream(Stub())  # type: ignore[arg-type]
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stream.ask(pb.CompleteBatchRequest(), 5.0)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert stream.broken is not None
        stream.close()
        await asyncio.sleep(0)
        del failed, stream  # the error's traceback holds the frame that held the batch's future
        gc.collect()
        assert lost == []

    asyncio.run(go())


@pytest.mark.parametrize("in_flight", [1, 2, 0])
def test_batches_in_flight_per_node(in_flight: int) -> None:
    """The first batches (as many as `in_flight` allows, one when it is 0) wait on the node for a lease (their hosts
    rest 30 s) while two more completions are made. With a bound those two wait for an answer and then go as one
    batch; without, they go (and are answered) at once. `sent()` returns as soon as a batch is on the stream, and
    does not wait for completions held back."""
    waiting = max(in_flight, 1)
    served = _served(30.0)
    try:

        async def go() -> None:
            clients = NodeClients(StaticRing([served.address]), worker_id="w")
            stub = clients.stub(served.address)
            await stub.Discover(pb.DiscoverRequest(links=seeds(waiting + 2, waiting + 2)), timeout=5)
            robots = (await stub.Lease(pb.LeaseRequest(worker_id="w", max_items=9), timeout=5)).items
            assert len(robots) == waiting + 2
            batches: list[int] = []  # completions in each batch, as `want` is asked once per batch

            def want(address: str, completing: int) -> int:
                batches.append(completing)
                return 1 if len(batches) <= waiting else 0  # only the first batches wait on the node for a lease

            batcher = CompletionBatcher(
                clients,
                want=want,
                leased=lambda address, items, asked: None,
                lease_wait_ms=3_000,
                stream=True,
                in_flight=in_flight,
            )
            answered: list[int] = []
            futures = []
            for i, item in enumerate(robots):
                future = batcher.submit(served.address, _done(item))
                future.add_done_callback(lambda f, i=i: answered.append(i))
                futures.append(future)
                await asyncio.wait_for(batcher.sent(), 5)
                if i < waiting:
                    assert not futures[i].done(), "the first batches should wait on the node for a lease"
            await asyncio.wait_for(asyncio.gather(*futures), 15)
            assert all(f.result().accepted for f in futures)
            if in_flight:
                assert batches == [1] * waiting + [2]
                assert answered[0] < waiting, "the held-back completions went before any batch in flight was answered"
            else:
                assert batches[0] == 1 and sum(batches) == 3
                assert answered[-1] == 0
            batcher.close()
            await clients.close()

        asyncio.run(go())
    finally:
        served.close()
