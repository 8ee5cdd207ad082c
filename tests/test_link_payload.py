"""Link.payload: opaque client data a node keeps with the item a link admits and hands back on every lease.

The Scrapy plug-in keeps a spider's serialised request there (callback, meta, ...), so any process that leases
the URL can rebuild it. Checked here on every layer it crosses: the core (cap, first admission wins, retries
keep it), the journal (replay rebuilds it), every store backend (binary-safe, across a reopen), the Redis
handoff export, a SQLite file of schema 1 upgraded in place, and a real node process over gRPC across SIGKILL.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import grpc
import pytest

from frontier_node.core.config import FrontierConfig, PolitenessConfig, RetryConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.journal import pack_admit, replay, unpack_admit
from frontier_node.core.ports import Store
from frontier_node.core.records import Item, Link, Outcome, Verdict
from frontier_node.store.memory import MemoryStore
from frontier_node.store.redis.codec import export_item, import_item, pack_row, unpack_row
from frontier_node.store.sqlite import SCHEMA_KEY, SCHEMA_VERSION, SqliteStore
from hostring.clock import VirtualClock
from hostring.limits import MAX_LINK_PAYLOAD_BYTES
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from hostring_testing.crawls import serve
from tests.store_helpers import admit, page
from tests.test_store_contract import Backend, durable, store, store_backend  # noqa: F401 (fixtures)

BINARY = bytes(range(256)) + b"\x00\x1f\t\n" + "é😀".encode()


def frontier(backing: Store | None = None) -> tuple[Frontier, VirtualClock]:
    clock = VirtualClock(1000.0)
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0), retry=RetryConfig(base_s=1.0, jitter=0.0))
    return Frontier(backing or MemoryStore(), clock, config, run_id="r"), clock


def lease_page(f: Frontier, clock: VirtualClock) -> Item:
    """Lease until a page comes out, answering robots items with 404 (allow all)."""
    for _ in range(10):
        for item in f.lease("w", 10):
            if item.url.endswith("/robots.txt"):
                f.complete(item.key, item.generation, Outcome(status=404))
            else:
                return item
        clock.advance(1.0)
    raise AssertionError("no page was leased")


# ---------------------------------------------------------------------------------------------- the core


def test_the_first_admission_payload_is_leased_and_kept_across_a_retry() -> None:
    f, clock = frontier()
    verdicts = f.discover([Link("http://a.example/x", payload=b"first"), Link("http://a.example/x", payload=b"2nd")])
    assert [v.verdict for v in verdicts] == [Verdict.ADMITTED, Verdict.DUPLICATE]
    item = lease_page(f, clock)
    assert item.payload == b"first"
    done = f.complete(item.key, item.generation, Outcome(status=503))
    assert done.state == "retryable"
    clock.advance(30.0)
    again = lease_page(f, clock)
    assert again.key == item.key and again.attempt == 2 and again.payload == b"first"


def test_a_payload_over_the_cap_is_rejected_by_name_and_not_stored() -> None:
    f, _ = frontier()
    at_cap, over = b"x" * MAX_LINK_PAYLOAD_BYTES, b"x" * (MAX_LINK_PAYLOAD_BYTES + 1)
    verdicts = f.discover([Link("http://a.example/ok", payload=at_cap), Link("http://a.example/big", payload=over)])
    assert [(v.verdict, v.reason) for v in verdicts] == [
        (Verdict.ADMITTED, ""),
        (Verdict.REJECTED, "payload_too_large"),
    ]
    # the refused link is not even seen: the same URL without the oversized payload is admitted
    assert f.discover([Link("http://a.example/big")])[0].verdict is Verdict.ADMITTED


def test_replay_rebuilds_the_payload_and_lines_without_one_are_unchanged() -> None:
    it = page("/p", "www.a.example", 3)
    plain = pack_admit(it)
    assert len(plain.split("\t")) == 10
    it.payload = BINARY
    packed = pack_admit(it)
    assert packed.startswith(plain + "\t") and unpack_admit(it.key, packed).payload == BINARY
    with pytest.raises(ValueError, match="not base64"):
        unpack_admit(it.key, plain + "\t!!")
    mem = MemoryStore()
    f, _ = frontier(mem)
    f.discover([Link("http://b.example/x", payload=BINARY), Link("http://b.example/y")])
    rebuilt = replay(mem.journal())
    assert rebuilt["http://b.example/x"].item is not None and rebuilt["http://b.example/x"].item.payload == BINARY
    assert rebuilt["http://b.example/y"].item is not None and rebuilt["http://b.example/y"].item.payload == b""


# ---------------------------------------------------------------------------------------------- stores


def test_every_store_keeps_a_binary_payload(store: Store) -> None:  # noqa: F811
    it = page("/p", "www.a.example", 1)
    it.payload = BINARY + b"\x00" * (MAX_LINK_PAYLOAD_BYTES - len(BINARY))
    bare = page("/q", "www.a.example", 2)
    admit(store, admit(store, 1, it), bare)
    for _ in range(2):  # buffered, then flushed
        assert store.get(it.key) == it and store.get(bare.key) == bare
        assert [i.payload for i in store.backlog("www.a.example", (-1, 0), 10)] == [it.payload, b""]
        assert {i.key: i.payload for i in store.items()} == {it.key: it.payload, bare.key: b""}
        store.flush()


def test_payload_survives_a_reopen(durable: Backend) -> None:  # noqa: F811
    s = durable.open()
    it = page("/p", "www.a.example", 1)
    it.payload = BINARY
    admit(s, 1, it)
    s.close()
    assert durable.open().get(it.key) == it


def test_redis_rows_and_handoff_exports_carry_the_payload() -> None:
    it = page("/p", "www.a.example", 1)
    assert unpack_row(it.key, pack_row(it, 1)) == it
    assert "payload" not in pack_row(it, 1) and pack_row(it, 1).endswith('""]')  # rows without one are unchanged
    it.payload = BINARY
    assert unpack_row(it.key, pack_row(it, 1)) == it
    exported = json.loads(json.dumps(export_item(it, 7)))
    assert import_item(exported) == (it, 7)
    del exported["payload"]  # an export written before payloads existed
    assert import_item(exported)[0].payload == b""


REVISIT_COLUMNS = ("checked_at", "stored_at", "interval_s", "visits", "changes", "watched_s", "changed_s", "simhash")


def test_a_schema_1_sqlite_file_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    SqliteStore(path).close()
    it = page("/p", "www.a.example", 1)
    with sqlite3.connect(path) as con:  # make it a version-1 file with one row, as the previous release wrote
        for column in ("payload", *REVISIT_COLUMNS):  # the columns schema versions 2 and 3 added
            con.execute(f"ALTER TABLE items DROP COLUMN {column}")
        con.execute("UPDATE meta SET value = '1' WHERE name = ?", (SCHEMA_KEY,))
        con.execute(
            "INSERT INTO items VALUES (?,?,?,?,?,1,0,0,1,0,'scheduled',0,0,'',0,0,0,'','','','','')",
            (it.key, it.url, it.host, it.origin, it.domain),
        )
    s = SqliteStore(path)
    try:
        assert s.get(it.key) == it
        it.payload = b"now"
        admit(s, 1, it)
        s.flush()
        assert s.get(it.key) == it
    finally:
        s.close()
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT value FROM meta WHERE name = ?", (SCHEMA_KEY,)).fetchone() == (str(SCHEMA_VERSION),)


# ---------------------------------------------------------------------------------------------- the wire


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_node_hands_the_payload_back_on_lease_also_after_sigkill(tmp_path: Path) -> None:
    """A real `hostring node` on SQLite: Discover with a payload, Lease it back; SIGKILL the node mid-lease,
    restart it on the same file, and the re-issued lease still carries the payload."""
    db = tmp_path / "node.sqlite3"
    args = ["node", "--store", f"sqlite:///{db}", "--listen", "127.0.0.1:0", "--delay", "0", "--lease-s", "1"]

    def leased_page(stub: pb_grpc.FrontierStub) -> pb.LeaseItem:
        for _ in range(50):
            for item in stub.Lease(pb.LeaseRequest(worker_id="t", max_items=10, wait_ms=500), timeout=10).items:
                if item.kind == pb.ROBOTS:
                    stub.Complete(
                        pb.CompleteRequest(
                            lease_id=item.lease_id,
                            generation=item.generation,
                            outcome=pb.Outcome(status=404),
                            worker_id="t",
                        ),
                        timeout=10,
                    )
                else:
                    return item
        raise AssertionError("no page was leased")

    proc, port = serve(args, tmp_path, "node1")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
            resp = stub.Discover(
                pb.DiscoverRequest(
                    links=[
                        pb.Link(observed="http://a.example/x", seed=True, payload=BINARY),
                        pb.Link(observed="http://a.example/big", payload=b"x" * (MAX_LINK_PAYLOAD_BYTES + 1)),
                    ]
                ),
                timeout=10,
            )
            assert [(v.verdict, v.reason) for v in resp.verdicts] == [
                (pb.ADMITTED, ""),
                (pb.REJECTED, "payload_too_large"),
            ]
            first = leased_page(stub)
            assert first.url == "http://a.example/x" and first.payload == BINARY
    finally:
        proc.stop(signal.SIGKILL)
    proc, port = serve(args, tmp_path, "node2")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            again = leased_page(pb_grpc.FrontierStub(channel))  # type: ignore[no-untyped-call]
            assert again.url == first.url and again.generation > first.generation and again.payload == BINARY
    finally:
        proc.stop(signal.SIGKILL)
