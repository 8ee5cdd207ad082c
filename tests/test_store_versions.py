"""Stored forms written by every release and branch still read, now that a row holds both a client payload (Link
.payload, #14) and a page's revisit numbers (#11): SQLite files of schema 1, of main's schema 2 (payload) and of
the revisit branch's schema 2 (revisit columns, never shipped) open as schema 3 with their rows intact, and the
offline report reads each as it is; Redis rows of every length and exports of both formats read back.
"""

from __future__ import annotations

import base64
import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from frontier_node.core.ports import StoreLost
from frontier_node.core.records import Item
from frontier_node.core.states import State
from frontier_node.offline_report import store_report
from frontier_node.store.redis import RedisStore
from frontier_node.store.redis.codec import SEP, export_item, import_item, pack_row, unpack_row
from frontier_node.store.sqlite import ITEM_COLUMNS, SCHEMA_KEY, SCHEMA_VERSION, SqliteStore
from tests.store_helpers import admit, make_entry, page

BASE_COLUMNS = """
    key TEXT PRIMARY KEY NOT NULL, url TEXT NOT NULL, host TEXT NOT NULL, origin TEXT NOT NULL,
    domain TEXT NOT NULL, kind INTEGER NOT NULL, depth INTEGER NOT NULL, priority INTEGER NOT NULL,
    seq INTEGER NOT NULL, redirect_hops INTEGER NOT NULL, state TEXT NOT NULL, attempt INTEGER NOT NULL,
    generation INTEGER NOT NULL, reason TEXT NOT NULL, deadline REAL NOT NULL, due_at REAL NOT NULL,
    status INTEGER NOT NULL, etag TEXT NOT NULL, last_modified TEXT NOT NULL, evidence TEXT NOT NULL,
    digest TEXT NOT NULL, source TEXT NOT NULL"""
PAYLOAD_COLUMN = ", payload BLOB NOT NULL DEFAULT x''"
REVISIT_COLUMNS = """, checked_at REAL NOT NULL DEFAULT 0, stored_at REAL NOT NULL DEFAULT 0,
    interval_s REAL NOT NULL DEFAULT 0, visits REAL NOT NULL DEFAULT 0, changes REAL NOT NULL DEFAULT 0,
    watched_s REAL NOT NULL DEFAULT 0, changed_s REAL NOT NULL DEFAULT 0, simhash INTEGER NOT NULL DEFAULT 0"""
REVISIT_FIELDS = ("checked_at", "stored_at", "interval_s", "visits", "changes", "watched_s", "changed_s", "simhash")
OTHER_TABLES = """
CREATE TABLE meta (name TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);
CREATE TABLE journal (
    seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL, key TEXT NOT NULL, attempt INTEGER NOT NULL,
    generation INTEGER NOT NULL, from_state TEXT NOT NULL, event TEXT NOT NULL, to_state TEXT NOT NULL,
    at REAL NOT NULL, policy_version INTEGER NOT NULL, reason TEXT NOT NULL, evidence TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX items_backlog ON items (host, priority, seq) WHERE state = 'scheduled';
CREATE TABLE robots (origin TEXT PRIMARY KEY NOT NULL, host TEXT NOT NULL, record TEXT NOT NULL);
"""
# The files that exist: (schema version stored, columns beyond the base ones, what their row holds).
KINDS = {
    "schema 1": ("1", "", ""),
    "schema 2 of main (payload)": ("2", PAYLOAD_COLUMN, "payload"),
    "schema 2 of the revisit branch": ("2", REVISIT_COLUMNS, "revisit"),
}


def _fetched(holds: str) -> Item:
    """A fetched page as the kind of file holds it: with a payload, a change history, or neither."""
    item = page("/a", "www.shop.example", 7, state=State.FETCHED)
    item.status, item.etag, item.digest, item.evidence = 200, '"v1"', "sha256:ab", "<urn:uuid:1>"
    if holds == "payload":
        item.payload = b"\x00scrapy request\xff"
    if holds == "revisit":
        item.due_at, item.checked_at, item.stored_at, item.interval_s = 5000.25, 4000.5, 3000.125, 999.75
        item.visits, item.changes, item.watched_s, item.changed_s = 3.5, 1.25, 1234.5, 234.25
        item.simhash = 0x0F0F0F0F0F0F0F0F
    return item


def _old_file(path: Path, version: str, extra: str, item: Item) -> None:
    columns = [c for c in ITEM_COLUMNS if c in BASE_COLUMNS + extra]
    with sqlite3.connect(path) as con:
        con.executescript(f"CREATE TABLE items ({BASE_COLUMNS}{extra});" + OTHER_TABLES)
        con.execute("INSERT INTO meta VALUES (?, ?)", (SCHEMA_KEY, version))
        con.execute("INSERT INTO meta VALUES ('run_id', 'old-run')")
        values = [getattr(item, c) for c in columns]
        values[columns.index("kind")] = int(item.kind)
        values[columns.index("state")] = item.state.value
        marks = ", ".join("?" * len(columns))
        con.execute(f"INSERT INTO items ({', '.join(columns)}) VALUES ({marks})", values)
        con.execute(
            "INSERT INTO journal VALUES (1, 'old-run', ?, 1, 1, 'leased', 'complete', 'fetched', 1.0, 1, '200', "
            "'<urn:uuid:1>', '')",
            (item.key,),
        )


def _schema(path: Path) -> tuple[str, set[str]]:
    with sqlite3.connect(path) as con:
        (version,) = con.execute("SELECT value FROM meta WHERE name = ?", (SCHEMA_KEY,)).fetchone()
        return str(version), {r[1] for r in con.execute("PRAGMA table_info(items)")}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_older_sqlite_file_is_read_offline_as_it_is_and_upgraded_to_schema_3(kind: str, tmp_path: Path) -> None:
    version, extra, holds = KINDS[kind]
    path = tmp_path / "old.sqlite3"
    item = _fetched(holds)
    _old_file(path, version, extra, item)
    before = _schema(path)

    report = store_report(path)  # read-only: the report reads the file as it is and changes nothing
    assert report["by_state"] == {"fetched": 1} and report["journal"]["disagreeing_items"] == 0
    assert _schema(path) == before

    store = SqliteStore(path)  # a node opens it: upgraded in place
    try:
        assert store.get(item.key) == item  # what the file held, and defaults for what it did not
        item.payload, item.visits, item.simhash = b"both", 9.0, 2**64 - 1  # now a row holds both
        store.record(make_entry(2, item.key, "fetched", "refetch", "fetched"), item)
        store.flush()
        assert store.get(item.key) == item
    finally:
        store.close()
    assert SCHEMA_VERSION == 3
    assert _schema(path) == ("3", set(ITEM_COLUMNS))
    reopened = SqliteStore(path)
    try:
        assert [r for r in reopened.items()] == [item]
    finally:
        reopened.close()
    assert store_report(path)["by_state"] == {"fetched": 1}


def test_a_new_sqlite_file_has_schema_3_and_keeps_payload_and_revisit_numbers(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite3"
    store = SqliteStore(path)
    try:
        item = _fetched("revisit")
        item.payload = b"p"
        admit(store, 1, item)
        store.flush()
        assert store.get(item.key) == item
    finally:
        store.close()
    assert _schema(path) == ("3", set(ITEM_COLUMNS))


# ---------------------------------------------------------------------------------------------- Redis rows


def _row_list(packed: str) -> list[object]:
    rest: list[object] = json.loads(packed.split(SEP, 4)[4])
    return rest


@pytest.mark.parametrize(
    ("holds", "entries"),
    [("", 17), ("revisit", 25), ("payload", 26), ("both", 26)],
)
def test_a_redis_row_carries_what_the_item_has_and_nothing_more(holds: str, entries: int) -> None:
    item = _fetched("revisit" if holds in ("revisit", "both") else "")
    if holds in ("payload", "both"):
        item.payload = b"\x00\x01payload"
    packed = pack_row(item, 3)
    assert len(_row_list(packed)) == entries  # a one-shot page without payload stays as short as before
    assert unpack_row(item.key, packed) == item


def test_redis_rows_written_before_the_merge_still_read() -> None:
    main = _fetched("payload")  # main wrote the payload as an 18th entry
    fields = _row_list(pack_row(_fetched(""), 3))
    packed = (
        pack_row(_fetched(""), 3).rsplit(SEP, 1)[0]
        + SEP
        + json.dumps([*fields, base64.b64encode(main.payload).decode()], separators=(",", ":"))
    )
    assert unpack_row(main.key, packed) == main
    revisit = _fetched("revisit")  # the revisit branch wrote its 8 numbers after the 17, never a payload
    packed = pack_row(revisit, 3)
    assert len(_row_list(packed)) == 25 and unpack_row(revisit.key, packed) == revisit


_floats = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=200, deadline=None)
@given(
    payload=st.binary(max_size=64),
    numbers=st.tuples(_floats, _floats, _floats, _floats, _floats, _floats, _floats),
    simhash=st.integers(0, 2**64 - 1),
    zero=st.booleans(),
)
def test_any_row_round_trips_through_redis_rows_and_exports(
    payload: bytes, numbers: tuple[float, ...], simhash: int, zero: bool
) -> None:
    item = _fetched("")
    item.payload = payload
    if not zero:
        (item.checked_at, item.stored_at, item.interval_s, item.visits, item.changes, item.watched_s,
         item.changed_s) = numbers  # fmt: skip
        item.simhash = simhash
    assert unpack_row(item.key, pack_row(item, 5)) == item
    assert import_item(json.loads(json.dumps(export_item(item, 5)))) == (item, 5)


# ---------------------------------------------------------------------------------------------- Redis stores


@pytest.fixture
def redis_store(redis_url: str, redis_namespace: str) -> Iterator[RedisStore]:
    client = redis.Redis.from_url(redis_url)
    store = RedisStore(client, node_id="n1", epoch=1, namespace=redis_namespace)
    yield store
    store.close()


def test_a_format_1_export_with_a_payload_imports_and_format_2_carries_both(redis_store: RedisStore) -> None:
    item = _fetched("revisit")
    item.payload = b"request"
    admit(redis_store, 1, item)
    redis_store.flush()
    data = redis_store.export_domain("shop.example")
    assert data["format"] == 2
    (row,) = data["items"]
    assert row["payload"] == base64.b64encode(b"request").decode() and row["visits"] == 3.5
    old = json.loads(json.dumps(data))  # as main wrote it: format 1, a payload, no revisit numbers
    old["format"] = 1
    for field in REVISIT_FIELDS:
        del old["items"][0][field]
    redis_store.import_domain("shop.example", old, 2)
    got = redis_store.get(item.key)
    assert got is not None and got.payload == b"request" and (got.visits, got.simhash) == (0.0, 0)


def test_prune_checks_the_store_like_a_flush_does(redis_url: str, redis_namespace: str) -> None:
    """Prune is a write: a Redis that lost this node's data answers StoreLost, not a silent success."""
    client = redis.Redis.from_url(redis_url)
    store = RedisStore(client, node_id="n1", epoch=1, namespace=redis_namespace)
    try:
        item = _fetched("revisit")
        admit(store, 1, item)
        store.flush()
        client.delete(f"{redis_namespace}:{{d:shop.example}}:fence")  # one shard lost the domain's keys
        with pytest.raises(StoreLost):
            store.prune([item.key])
    finally:
        with contextlib.suppress(StoreLost):  # a lost store says so from every call, closing included
            store.close()
    other = RedisStore(client, node_id="n2", epoch=1, namespace=redis_namespace + "-b")
    try:
        admit(other, 1, item)
        other.flush()
        client.delete(f"{redis_namespace}-b:{{all}}:instance")  # the server restarted empty
        with pytest.raises(StoreLost):
            other.prune([item.key])
    finally:
        with contextlib.suppress(StoreLost):
            other.close()
