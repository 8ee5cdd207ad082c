"""The revisit fields of a row in every store: round trips, an older SQLite file migrated, an older Redis row and
export still read, and retention's prune deleting rows and their journal lines (fenced in Redis)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from frontier_node.core.records import Item
from frontier_node.core.states import State
from frontier_node.offline_report import store_report
from frontier_node.store.memory import MemoryStore
from frontier_node.store.redis import FencedOut, RedisStore
from frontier_node.store.redis.codec import SEP, pack_row, unpack_row
from frontier_node.store.sqlite import SCHEMA_KEY, SCHEMA_VERSION, SqliteStore
from tests.store_helpers import admit, make_entry, page

# What a version-1 store looked like: the schema before the revisit columns.
V1_SCHEMA = """
CREATE TABLE meta (name TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);
CREATE TABLE journal (
    seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL, key TEXT NOT NULL, attempt INTEGER NOT NULL,
    generation INTEGER NOT NULL, from_state TEXT NOT NULL, event TEXT NOT NULL, to_state TEXT NOT NULL,
    at REAL NOT NULL, policy_version INTEGER NOT NULL, reason TEXT NOT NULL, evidence TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE items (
    key TEXT PRIMARY KEY NOT NULL, url TEXT NOT NULL, host TEXT NOT NULL, origin TEXT NOT NULL,
    domain TEXT NOT NULL, kind INTEGER NOT NULL, depth INTEGER NOT NULL, priority INTEGER NOT NULL,
    seq INTEGER NOT NULL, redirect_hops INTEGER NOT NULL, state TEXT NOT NULL, attempt INTEGER NOT NULL,
    generation INTEGER NOT NULL, reason TEXT NOT NULL, deadline REAL NOT NULL, due_at REAL NOT NULL,
    status INTEGER NOT NULL, etag TEXT NOT NULL, last_modified TEXT NOT NULL, evidence TEXT NOT NULL,
    digest TEXT NOT NULL, source TEXT NOT NULL
);
CREATE INDEX items_backlog ON items (host, priority, seq) WHERE state = 'scheduled';
CREATE TABLE robots (origin TEXT PRIMARY KEY NOT NULL, host TEXT NOT NULL, record TEXT NOT NULL);
"""


def revisited(path: str = "/a", host: str = "www.shop.example", seq: int = 1) -> Item:
    """A fetched page with a change history, a due time and a simhash above 2**63."""
    item = page(path, host, seq, state=State.FETCHED)
    item.status, item.etag, item.digest, item.evidence = 200, '"v3"', "sha256:ab", "<urn:uuid:1>"
    item.due_at, item.checked_at, item.stored_at, item.interval_s = 5000.25, 4000.5, 3000.125, 999.75
    item.visits, item.changes, item.watched_s, item.changed_s = 31.5, 7.25, 12345.5, 2345.25
    item.simhash = 0xF0F0F0F0F0F0F0F1
    return item


@pytest.fixture
def redis_store(redis_url: str, redis_namespace: str) -> Iterator[RedisStore]:
    client = redis.Redis.from_url(redis_url)
    store = RedisStore(client, node_id="n1", epoch=1, namespace=redis_namespace)
    yield store
    store.close()
    for key in list(client.scan_iter(match=f"{redis_namespace}*", count=1000)):
        client.delete(key)
    client.close()


def test_every_store_keeps_the_revisit_fields_of_a_row(tmp_path: Path, redis_store: RedisStore) -> None:
    for store in (MemoryStore(), SqliteStore(tmp_path / "s.sqlite3"), redis_store):
        item = revisited()
        admit(store, 1, item)
        item.state = State.FETCHED
        store.record(make_entry(3, item.key, "scheduled", "lease", "fetched"), item)
        assert store.get(item.key) == item  # from the buffer
        store.flush()
        assert store.get(item.key) == item  # from the store
        assert list(store.items()) == [item]


def test_a_version_1_sqlite_store_is_migrated_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as con:
        con.executescript(V1_SCHEMA)
        con.execute("INSERT INTO meta VALUES (?, '1')", (SCHEMA_KEY,))
        con.execute("INSERT INTO meta VALUES ('run_id', 'old-run')")
        con.execute(
            "INSERT INTO items VALUES ('https://a.example/', 'https://a.example/', 'a.example', 'https://a.example', "
            "'a.example', 1, 0, 0, 7, 0, 'fetched', 1, 1, '', 0, 0, 200, '\"e\"', '', 'rec', 'sha256:x', '')"
        )
    # read offline as it is (read-only: not migrated), then opened by a node (migrated)
    assert store_report(path)["by_state"] == {"fetched": 1}
    store = SqliteStore(path)
    try:
        (row,) = list(store.items())
        assert (row.key, row.etag, row.digest, row.seq) == ("https://a.example/", '"e"', "sha256:x", 7)
        assert (row.checked_at, row.visits, row.simhash) == (0.0, 0.0, 0)
        row.checked_at, row.simhash = 10.0, 2**64 - 1
        store.record(make_entry(1, row.key, "fetched", "refetch", "fetched"), row)
        store.flush()
        assert store.get(row.key) == row
    finally:
        store.close()
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT value FROM meta WHERE name = ?", (SCHEMA_KEY,)).fetchone() == (str(SCHEMA_VERSION),)
    assert SCHEMA_VERSION == 3  # 2 added the payload column (main), 3 the revisit columns


def test_an_older_redis_row_reads_with_an_empty_history() -> None:
    item = revisited()
    packed = pack_row(item, 1)
    head, rest = packed.rsplit(SEP, 1)
    fields = json.loads(rest)
    assert len(fields) == 25
    old = head + SEP + json.dumps(fields[:17])  # a row as written before the revisit fields
    old_item = unpack_row(item.key, old)
    assert (old_item.etag, old_item.digest, old_item.due_at) == (item.etag, item.digest, item.due_at)
    assert (old_item.checked_at, old_item.visits, old_item.simhash) == (0.0, 0.0, 0)
    assert unpack_row(item.key, packed) == item


def test_a_format_1_export_imports_and_a_new_one_carries_the_history(redis_store: RedisStore) -> None:
    item = revisited(host="www.moving.example")
    admit(redis_store, 1, item)
    item.state = State.FETCHED
    redis_store.record(make_entry(3, item.key, "scheduled", "lease", "fetched"), item)
    redis_store.flush()
    data = redis_store.export_domain("moving.example")
    assert data["format"] == 2 and data["items"][0]["visits"] == 31.5
    old = dict(data, format=1, domain="moving.example")
    old["items"] = [{k: v for k, v in row.items() if k not in ("checked_at", "stored_at", "interval_s", "visits",
                                                               "changes", "watched_s", "changed_s", "simhash")}
                    for row in data["items"]]  # fmt: skip
    redis_store.import_domain("moving.example", old, 1)
    row = redis_store.get(item.key)
    assert row is not None and row.visits == 0 and row.etag == item.etag
    redis_store.import_domain("moving.example", data, 1)
    assert redis_store.get(item.key) == item


def test_prune_deletes_rows_and_their_journal_lines_in_every_store(tmp_path: Path, redis_store: RedisStore) -> None:
    for store in (MemoryStore(), SqliteStore(tmp_path / "p.sqlite3"), redis_store):
        gone, kept = revisited("/gone", seq=1), revisited("/kept", seq=2)
        jseq = admit(store, 1, gone)
        jseq = admit(store, jseq, kept)
        gone.state = kept.state = State.FAILED
        store.record(make_entry(jseq, gone.key, "scheduled", "fail", "failed"), gone)
        store.record(make_entry(jseq + 1, kept.key, "scheduled", "fail", "failed"), kept)
        store.prune([gone.key])  # buffered writes land first
        assert store.get(gone.key) is None and store.history(gone.key) == []
        assert [r.key for r in store.items()] == [kept.key]
        assert len(store.history(kept.key)) == 3
        assert store.counts_by_state() == {"failed": 1}


def test_a_node_that_lost_the_domain_cannot_prune_it(redis_url: str, redis_namespace: str) -> None:
    client = redis.Redis.from_url(redis_url)
    a = RedisStore(client, node_id="a", epoch=1, namespace=redis_namespace)
    b = RedisStore(client, node_id="b", epoch=2, namespace=redis_namespace)
    try:
        item = revisited(host="www.fenced.example")
        admit(a, 1, item)
        a.flush()
        b.claim("fenced.example", 2)
        with pytest.raises(FencedOut):
            a.prune([item.key])
        assert b.get(item.key) is not None
    finally:
        b.close()
        client.close()
