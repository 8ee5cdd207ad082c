"""The coordinator over real gRPC on loopback: nodes join, heartbeat and expire; watchers follow every epoch."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
import redis

from coordinator.server import RunningCoordinator, start_coordinator
from hostring.membership import NodeMembership, RingWatcher
from hostring.ring import Ring
from hostring.v1 import coordinator_pb2 as pb
from hostring.v1 import coordinator_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(30)

TIMEOUT = 0.5  # heartbeat timeout: small so expiry is quick; nodes heartbeat every TIMEOUT / 3


@pytest.fixture
def coordinator() -> Iterator[RunningCoordinator]:
    c = start_coordinator("127.0.0.1:0", heartbeat_timeout_s=TIMEOUT)
    yield c
    c.stop()


def _addr(c: RunningCoordinator) -> str:
    return f"127.0.0.1:{c.port}"


def _node(addr: str, node_id: str, rings: list[Ring] | None = None) -> NodeMembership:
    return NodeMembership(
        addr,
        node_id,
        f"127.0.0.1:{7000 + int(node_id[-1], 36)}",
        heartbeat_s=2.0,
        on_ring=rings.append if rings is not None else None,
    )


def _members(ids: str) -> Callable[[Ring], bool]:
    want = {f"node-{c}" for c in ids}
    return lambda r: set(r.members) == want


def _wait(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    give_up = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < give_up, "condition not reached in time"
        time.sleep(0.02)


def test_nodes_join_heartbeat_expire_and_leave(coordinator: RunningCoordinator) -> None:
    addr = _addr(coordinator)

    async def scenario() -> None:
        seen: list[Ring] = []
        watcher = RingWatcher(addr, on_ring=seen.append)
        assert (await watcher.start()).epoch == 0
        rings_a: list[Ring] = []
        a = _node(addr, "node-a", rings_a).start()
        b = _node(addr, "node-b")
        try:
            await watcher.wait_for(lambda r: r.epoch >= 1)
            # a's own watch may start after its Register: b joins once a has seen the ring it made, epoch 1
            await asyncio.to_thread(a.wait_ring, lambda r: r.epoch >= 1)
            b.start()
            ring = await watcher.wait_for(_members("ab"))
            assert [r.epoch for r in seen] == [1, 2]
            assert set(seen[0].members) == {"node-a"}
            assert ring.members["node-b"].address == "127.0.0.1:7011"
            assert watcher.owner("example.com") in {"127.0.0.1:7010", "127.0.0.1:7011"}
            assert sorted(watcher.nodes()) == ["127.0.0.1:7010", "127.0.0.1:7011"]
            assert (await asyncio.to_thread(b.wait_ring, _members("ab"))).epoch == 2
            assert (await asyncio.to_thread(a.wait_ring, _members("ab"))).epoch == 2
            assert [r.epoch for r in rings_a] == [1, 2]

            await asyncio.sleep(4 * TIMEOUT)  # heartbeats (every TIMEOUT / 3) keep both in
            assert watcher.ring.epoch == 2

            # A node that registers and then goes silent leaves the ring after the timeout.
            with grpc.insecure_channel(addr) as ch:
                stub = pb_grpc.CoordinatorStub(ch)
                stub.Register(pb.RegisterRequest(node_id="node-c", address="127.0.0.1:7012"), timeout=5)
                assert not stub.Heartbeat(pb.HeartbeatRequest(node_id="node-x"), timeout=5).ok
            await watcher.wait_for(lambda r: r.epoch == 3 and "node-c" in r.members)
            t0 = time.monotonic()
            ring = await watcher.wait_for(lambda r: r.epoch == 4, timeout=5 * TIMEOUT)
            assert TIMEOUT * 0.5 < time.monotonic() - t0 < TIMEOUT * 4
            assert set(ring.members) == {"node-a", "node-b"}

            # A graceful stop leaves at once; a crash (no Leave) is noticed by expiry.
            await asyncio.to_thread(a.wait_ring, lambda r: r.epoch == 4)
            await asyncio.to_thread(a.stop)
            assert set((await watcher.wait_for(lambda r: r.epoch == 5)).members) == {"node-b"}
            await asyncio.to_thread(b.stop, leave=False)
            assert len(await watcher.wait_for(lambda r: r.epoch == 6, timeout=5 * TIMEOUT)) == 0
            assert [r.epoch for r in seen] == [1, 2, 3, 4, 5, 6]
            epochs_a = [r.epoch for r in rings_a]
            assert epochs_a[:2] == [1, 2] and epochs_a[-1] == 4 and epochs_a == sorted(set(epochs_a))
        finally:
            await asyncio.to_thread(a.stop)
            await asyncio.to_thread(b.stop)
            await watcher.close()

    asyncio.run(scenario())


def test_moved_names_a_domains_new_owner_as_the_ring_changes(coordinator: RunningCoordinator) -> None:
    """`moved(domain, address, timeout)` (what a worker's completion waits on while `address` is down): `address`
    back when nothing moved in that time; the new owner's address when the ring names one, at once when it already
    does, and while waiting as soon as the ring changes (not at the end of the wait)."""
    addr = _addr(coordinator)

    async def scenario() -> None:
        watcher = RingWatcher(addr)
        await watcher.start()
        a, b = _node(addr, "node-a"), _node(addr, "node-b")
        try:
            a.start()
            b.start()
            await watcher.wait_for(_members("ab"))
            b_address = watcher.ring.members["node-b"].address
            domain = next(d for d in (f"d{i}.example" for i in range(1000)) if watcher.owner(d) == b_address)
            a_address = watcher.ring.members["node-a"].address
            assert await watcher.moved(domain, b_address, 0.1) == b_address
            assert await watcher.moved(domain, "127.0.0.1:9", 60) == b_address
            waiting = asyncio.ensure_future(watcher.moved(domain, b_address, 60))
            await asyncio.to_thread(b.stop)
            assert await asyncio.wait_for(waiting, 30) == a_address
        finally:
            await asyncio.to_thread(a.stop)
            await asyncio.to_thread(b.stop)
            await watcher.close()

    asyncio.run(scenario())


def test_get_ring_reports_liveness(coordinator: RunningCoordinator) -> None:
    with grpc.insecure_channel(_addr(coordinator)) as ch:
        stub = pb_grpc.CoordinatorStub(ch)
        before = time.time()
        resp = stub.Register(pb.RegisterRequest(node_id="node-a", address="h:1", weight=2), timeout=5)
        assert resp.epoch == 1 and resp.heartbeat_timeout_ms == int(TIMEOUT * 1000)
        assert [(m.node_id, m.address, m.weight) for m in resp.ring.members] == [("node-a", "h:1", 2)]
        state = stub.GetRing(pb.GetRingRequest(), timeout=5)
        (m,) = state.members
        assert m.healthy and before * 1000 - 5 <= m.last_seen_ms <= time.time() * 1000 + 5
        time.sleep(TIMEOUT * 0.6)
        assert not stub.GetRing(pb.GetRingRequest(), timeout=5).members[0].healthy
        assert stub.Leave(pb.LeaveRequest(node_id="node-a"), timeout=5).left
        assert not stub.Leave(pb.LeaveRequest(node_id="node-a"), timeout=5).left


@pytest.mark.parametrize(
    ("request_", "detail"),
    [
        (pb.RegisterRequest(node_id="", address="h:1"), "node_id"),
        (pb.RegisterRequest(node_id="n", address=""), "address"),
        (pb.RegisterRequest(node_id="n", address="h:1", weight=1000), "weight"),
    ],
)
def test_bad_registrations_are_refused(
    coordinator: RunningCoordinator, request_: pb.RegisterRequest, detail: str
) -> None:
    with grpc.insecure_channel(_addr(coordinator)) as ch, pytest.raises(grpc.RpcError) as err:
        pb_grpc.CoordinatorStub(ch).Register(request_, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in (err.value.details() or "")


def test_watch_streams_end_cleanly_when_the_server_stops() -> None:
    c = start_coordinator("127.0.0.1:0", heartbeat_timeout_s=TIMEOUT)
    got: list[int] = []
    outcome: list[object] = []

    def watch() -> None:
        with grpc.insecure_channel(_addr(c)) as ch:
            try:
                for state in pb_grpc.CoordinatorStub(ch).WatchRing(pb.WatchRequest(known_epoch=0), timeout=20):
                    got.append(state.epoch)
                outcome.append("ended")
            except grpc.RpcError as e:
                outcome.append(e.code())

    threads = [threading.Thread(target=watch) for _ in range(3)]
    try:
        for t in threads:
            t.start()
        with grpc.insecure_channel(_addr(c)) as ch:
            pb_grpc.CoordinatorStub(ch).Register(pb.RegisterRequest(node_id="n", address="h:1"), timeout=5)
        _wait(lambda: len(got) == 3)
    finally:
        started = time.monotonic()
        c.stop(grace=5.0)
        for t in threads:
            t.join(10)
    assert time.monotonic() - started < 2.0, "streams ended at once, not after the grace period"
    assert got == [1, 1, 1]
    assert outcome == ["ended"] * 3


def _restart(old: RunningCoordinator, **kwargs: object) -> RunningCoordinator:
    """Stop a coordinator and start another on the same port, as a restarted process would."""
    port = old.port
    old.stop()
    return start_coordinator(f"127.0.0.1:{port}", heartbeat_timeout_s=TIMEOUT, **kwargs)  # type: ignore[arg-type]


def test_restart_with_redis_keeps_members_and_epoch(
    redis_url: str, redis_client: redis.Redis, redis_namespace: str
) -> None:
    ns = redis_namespace  # redis_client deletes the namespace afterwards
    c = start_coordinator("127.0.0.1:0", redis_url=redis_url, heartbeat_timeout_s=TIMEOUT, namespace=ns)
    addr = _addr(c)

    async def scenario() -> None:
        nonlocal c
        watcher = RingWatcher(addr)
        await watcher.start()
        a, b = _node(addr, "node-a").start(), _node(addr, "node-b").start()
        try:
            await watcher.wait_for(_members("ab"))
            assert watcher.ring.epoch == 2
            c = await asyncio.to_thread(_restart, c, redis_url=redis_url, namespace=ns)
            assert c.service.membership.epoch == 2
            assert set(c.service.membership.ring().members) == {"node-a", "node-b"}
            await asyncio.sleep(3 * TIMEOUT)  # the nodes' heartbeats reach the new process: nobody expires
            assert c.service.membership.epoch == 2
            assert a.registered and b.registered

            d = _node(addr, "node-d").start()
            try:
                ring = await watcher.wait_for(_members("abd"))
                assert ring.epoch == 3, "the epoch continues from Redis"
                assert (await asyncio.to_thread(a.wait_ring, _members("abd"))).epoch == 3
            finally:
                await asyncio.to_thread(d.stop)
            assert (await watcher.wait_for(_members("ab"))).epoch == 4
        finally:
            await asyncio.to_thread(a.stop)
            await asyncio.to_thread(b.stop)
            await watcher.close()

    try:
        asyncio.run(scenario())
    finally:
        c.stop()


def test_in_memory_restart_continues_above_the_epoch_clients_saw() -> None:
    c = start_coordinator("127.0.0.1:0", heartbeat_timeout_s=TIMEOUT)
    addr = _addr(c)

    async def scenario() -> None:
        nonlocal c
        seen: list[int] = []
        watcher = RingWatcher(addr, on_ring=lambda r: seen.append(r.epoch))
        await watcher.start()
        a, b = _node(addr, "node-a").start(), _node(addr, "node-b").start()
        try:
            await watcher.wait_for(_members("ab"))
            c = await asyncio.to_thread(_restart, c)  # forgets everything: nodes are told to register again
            ring = await watcher.wait_for(lambda r: r.epoch > 2 and _members("ab")(r))
            assert ring.epoch in (3, 4)
            assert c.service.membership.epoch == ring.epoch
            assert seen == sorted(set(seen)), "epochs only grow"
            refreshed = await watcher.refresh()
            assert refreshed == ring
        finally:
            await asyncio.to_thread(a.stop)
            await asyncio.to_thread(b.stop)
            await watcher.close()

    try:
        asyncio.run(scenario())
    finally:
        c.stop()


def test_watcher_start_fails_without_a_coordinator() -> None:
    async def scenario() -> None:
        watcher = RingWatcher("127.0.0.1:1")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await watcher.start(timeout=0.3)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        with pytest.raises(LookupError):
            watcher.owner("example.com")

    asyncio.run(scenario())
