"""Revisits through real processes and real stores: a `hostring node` on SQLite SIGKILLed with revisits pending,
and a handoff between two cores over Redis, both keeping every page's due time and change history.

The node test plays the fetch worker over gRPC (nothing is fetched: the hosts are never contacted). The
handoff test runs two cores in this process on two RedisStores of one Redis, the second adopting the domain.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import grpc
import pytest
import redis

from frontier_node.core.config import FrontierConfig, PolitenessConfig, RevisitConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.journal import replay
from frontier_node.core.records import Kind, Link, Outcome
from frontier_node.core.states import State
from frontier_node.store.redis import RedisStore
from frontier_node.store.sqlite import SqliteStore
from hostring.clock import VirtualClock
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from hostring_testing.crawls import CrawlProcess, hostring_cmd, run_cli, serve

RPC_TIMEOUT_S = 10.0
INTERVAL_S = 4.0
URLS = [f"http://h{i % 2}.example/p{i}" for i in range(6)]


def _node(
    store: Path, log_dir: Path, name: str, policy: tuple[str, ...] | None = None
) -> tuple[CrawlProcess, grpc.Channel, pb_grpc.FrontierStub]:
    if policy is None:
        policy = ("--revisit", "fixed", "--revisit-interval", f"{INTERVAL_S:g}s", "--revisit-min", "1s")
    proc, port = serve(
        ["node", "--store", f"sqlite:///{store}", "--listen", "127.0.0.1:0", "--delay", "0", "--lease-s", "30",
         *policy],
        log_dir,
        name,
    )  # fmt: skip
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=20)
    proc.port = port  # type: ignore[attr-defined]
    return proc, channel, pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]


def _lease(stub: pb_grpc.FrontierStub) -> list[pb.LeaseItem]:
    resp = stub.Lease(pb.LeaseRequest(worker_id="test", max_items=100), timeout=RPC_TIMEOUT_S)
    return list(resp.items)


def _complete(stub: pb_grpc.FrontierStub, item: pb.LeaseItem, outcome: pb.Outcome) -> pb.CompleteResponse:
    request = pb.CompleteRequest(lease_id=item.lease_id, generation=item.generation, outcome=outcome, worker_id="test")
    resp: pb.CompleteResponse = stub.Complete(request, timeout=RPC_TIMEOUT_S)
    return resp


def _digest(url: str) -> str:
    """A body digest as workers send it (the node refuses one that is not a token)."""
    return "sha256:" + hashlib.sha256(url.encode()).hexdigest()


def _page_outcome(url: str) -> pb.Outcome:
    evidence = f"<urn:uuid:{abs(hash(url))}>"
    return pb.Outcome(status=200, retry_after_s=-1, body_digest=_digest(url), etag=f'"{url}"',
                      last_modified="Mon, 01 Jan 2024 00:00:00 GMT", evidence=evidence)  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_revisits_survive_a_sigkill_with_their_due_times(tmp_path: Path) -> None:
    store = tmp_path / "node.sqlite3"
    proc, channel, stub = _node(store, tmp_path, "node-1")
    try:
        stub.Discover(pb.DiscoverRequest(links=[pb.Link(observed=u, seed=True) for u in URLS]), timeout=RPC_TIMEOUT_S)
        fetched_at: dict[str, float] = {}
        deadline = time.monotonic() + 20
        while len(fetched_at) < len(URLS) and time.monotonic() < deadline:
            for item in _lease(stub):
                if item.kind == pb.ROBOTS:
                    _complete(stub, item, pb.Outcome(status=404, retry_after_s=-1))
                else:
                    assert not item.revisit and not item.etag  # a first fetch: nothing to be conditional on
                    before = time.time()
                    assert _complete(stub, item, _page_outcome(item.url)).state == "fetched"
                    fetched_at[item.url] = before
            time.sleep(0.05)
        assert set(fetched_at) == set(URLS)
    finally:
        proc.kill()  # SIGKILL: no flush, no close
        channel.close()
    rows = {r.url: r for r in SqliteStore(store).items() if r.kind is Kind.PAGE}
    for url, row in rows.items():
        assert row.state is State.FETCHED and row.due_at == pytest.approx(row.checked_at + INTERVAL_S)
        assert row.checked_at >= fetched_at[url] - 1e-3

    proc, channel, stub = _node(store, tmp_path, "node-2")
    try:
        leased: dict[str, tuple[float, pb.LeaseItem]] = {}
        deadline = time.monotonic() + 30
        while len(leased) < len(URLS) and time.monotonic() < deadline:
            for item in _lease(stub):
                now = time.time()
                if item.kind == pb.ROBOTS:
                    _complete(stub, item, pb.Outcome(status=404, retry_after_s=-1))
                    continue
                leased[item.url] = (now, item)
                _complete(stub, item, pb.Outcome(status=304, retry_after_s=-1, etag=f'"{item.url}"'))
            time.sleep(0.05)
        assert set(leased) == set(URLS)
        for url, (at, item) in leased.items():
            assert at >= rows[url].due_at - 0.05, f"{url} leased {rows[url].due_at - at:.2f} s before it was due"
            # the lease says what a conditional revisit and its WARC record need
            assert item.revisit and item.etag == f'"{url}"' and item.last_modified.startswith("Mon, 01 Jan 2024")
            assert item.refers_to == rows[url].evidence and item.stored_digest == _digest(url)
            assert item.stored_at_ms == int(rows[url].stored_at * 1000)
    finally:
        proc.kill()
        channel.close()
    # after the second kill: every revisit is journaled, and the journal alone rebuilds the due times
    sqlite = SqliteStore(store)
    try:
        replayed = replay(sqlite.journal())
        for row in sqlite.items():
            if row.kind is Kind.PAGE:
                assert row.reason == "revisit:not_modified"
                again = replayed[row.key].item
                assert again is not None and again.due_at == row.due_at and again.visits == row.visits == 1
    finally:
        sqlite.close()


@pytest.mark.timeout(60)
def test_a_handoff_over_redis_carries_due_times_and_change_histories(redis_url: str, redis_namespace: str) -> None:
    client = redis.Redis.from_url(redis_url)
    clock = VirtualClock()
    config = FrontierConfig(
        politeness=PolitenessConfig(min_delay_s=0.0), revisit=RevisitConfig("adaptive", 100, 10, 1000)
    )
    store_a = RedisStore(client, node_id="node-a", epoch=1, namespace=redis_namespace)
    store_b = RedisStore(client, node_id="node-b", epoch=2, namespace=redis_namespace)
    try:
        a = Frontier(store_a, clock, config)
        a.discover([Link(f"http://www.moving.example/p{i}") for i in range(4)])
        version = dict.fromkeys(range(4), 0)
        for _ in range(3000):  # a few revisits each: p0 and p1 change at every visit, p2 and p3 never
            for it in a.lease("w", 10):
                if it.kind is Kind.ROBOTS:
                    a.complete(it.key, it.generation, Outcome(status=404))
                    continue
                i = int(it.url.rsplit("p", 1)[1])
                version[i] += i < 2
                simhash = (0x9E3779B97F4A7C15 * (version[i] + 1) * (i + 7)) & 0xFFFFFFFFFFFFFFFF  # far apart
                a.complete(
                    it.key, it.generation, Outcome(status=200, body_digest=f"d{i}.{version[i]}", simhash=simhash)
                )
            store_a.flush()
            clock.advance(1.0)
        before = {r.key: r for r in store_a.items() if r.kind is Kind.PAGE}
        assert all(r.visits >= 3 for r in before.values())
        assert {r.key: r.changes > 0 for r in before.values()} == {
            f"http://www.moving.example/p{i}": i < 2 for i in range(4)
        }
        # the domain moves to B: B claims it (A is fenced from then on) and adopts its rows
        adopted = store_b.adopt_domain("moving.example", 2)
        a.release({"moving.example"})
        b = Frontier(store_b, clock, config, recover=False)
        b.adopt(adopted.items, adopted.robots)
        after = {r.key: r for r in adopted.items if r.kind is Kind.PAGE}
        fields = (
            "state",
            "due_at",
            "checked_at",
            "interval_s",
            "visits",
            "changes",
            "watched_s",
            "changed_s",
            "simhash",
        )
        for key, row in before.items():
            assert tuple(getattr(after[key], f) for f in fields) == tuple(getattr(row, f) for f in fields), key
        # B revisits each page at its due time, not before; A never again
        first_due = min(r.due_at for r in before.values() if r.state is State.FETCHED)
        while clock.now() < first_due - 0.5:
            assert [it for it in b.lease("w", 10) if it.kind is Kind.PAGE] == []
            assert a.lease("w", 10) == []
            clock.advance(0.5)
        seen: set[str] = set()
        end = max(r.due_at for r in before.values()) + 5
        while clock.now() < end and seen != set(before):
            for it in b.lease("w", 10):
                if it.kind is Kind.PAGE:
                    if it.key not in seen:
                        assert before[it.key].due_at <= clock.now() < before[it.key].due_at + 1.0
                        assert it.generation > before[it.key].generation
                    seen.add(it.key)
                    b.complete(it.key, it.generation, Outcome(status=304))
                else:
                    b.complete(it.key, it.generation, Outcome(status=404))
            store_b.flush()
            clock.advance(0.5)
        assert seen == set(before)
        assert all(r.reason == "revisit:not_modified" for r in store_b.items() if r.kind is Kind.PAGE)
    finally:
        store_b.close()
        client.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_operator_refetches_a_page_and_overrides_a_policy_from_the_command_line(tmp_path: Path) -> None:
    proc, channel, stub = _node(tmp_path / "node.sqlite3", tmp_path, "node", policy=())  # one-shot
    address = f"127.0.0.1:{proc.port}"  # type: ignore[attr-defined]
    try:
        url = "http://h0.example/page"
        stub.Discover(pb.DiscoverRequest(links=[pb.Link(observed=url, seed=True)]), timeout=RPC_TIMEOUT_S)
        for _ in range(2):
            (item,) = _lease(stub)
            _complete(stub, item, pb.Outcome(status=404, retry_after_s=-1) if item.kind == pb.ROBOTS else
                      _page_outcome(url))  # fmt: skip
        assert stub.Lease(pb.LeaseRequest(worker_id="t", max_items=10), timeout=RPC_TIMEOUT_S).drained

        asked = time.time()
        refetch = run_cli(hostring_cmd("revisit", "refetch", url, "--in", "2s", "--node", address), None, tmp_path, 30)
        assert refetch.proc is not None and refetch.proc.returncode == 0, refetch.output()
        assert refetch.stdout().startswith(f"{url}: fetched again at ")
        leased: list[pb.LeaseItem] = []
        while not leased and time.time() < asked + 15:
            leased = [it for it in _lease(stub) if it.kind == pb.PAGE]
            time.sleep(0.05)
        assert leased and time.time() >= asked + 2.0 and leased[0].revisit and leased[0].etag == f'"{url}"'
        _complete(stub, leased[0], pb.Outcome(status=304, retry_after_s=-1))

        policy = run_cli(hostring_cmd("revisit", "policy", "h0.example", "--revisit", "adaptive",
                                      "--revisit-interval", "10s", "--node", address), None, tmp_path, 30)  # fmt: skip
        assert policy.proc is not None and policy.proc.returncode == 0, policy.output()
        assert "host h0.example: revisits adaptive from 10s in [1s, 100s], share 0.5" in policy.stdout()
        host = stub.GetHost(pb.GetHostRequest(host="h0.example"), timeout=RPC_TIMEOUT_S)
        assert host.revisit.startswith("adaptive from 10s")
        whole = run_cli(hostring_cmd("revisit", "policy", "h1.example", "--domain", "--revisit", "fixed",
                                     "--revisit-interval", "1m", "--node", address), None, tmp_path, 30)  # fmt: skip
        assert (
            whole.proc is not None
            and whole.proc.returncode == 0
            and "domain h1.example: revisits fixed every 1m" in (whole.stdout())
        ), whole.output()

        for args in (
            ("revisit", "refetch", "http://h0.example/never-seen", "--node", address),
            ("revisit", "policy", "h0.example", "--revisit-min", "1h", "--revisit-max", "1m", "--node", address),
        ):
            bad = run_cli(hostring_cmd(*args), None, tmp_path, 30)
            lines = bad.stderr().strip().splitlines()
            assert bad.proc is not None and bad.proc.returncode == 1 and len(lines) == 1, bad.output()
            assert ("NOT_FOUND" in lines[0] or "INVALID_ARGUMENT" in lines[0]) and "Traceback" not in bad.stderr()
    finally:
        proc.kill()
        channel.close()
