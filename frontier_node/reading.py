"""Reading a node's store off the core thread: what inspection (Report, GetUrl's history) reads instead of the core.

A report over every item or a scan of the journal takes time proportional to the crawl; done by the core thread
it would stall every other call. A reader has a connection of its own and reads only committed data, so it runs
on an inspection thread while the core goes on:

- SQLite: a read-only connection per read (WAL lets readers and the writer proceed together), inside one read
  transaction, as frontier_node/offline_report.py reads a finished crawl; leases whose rows the node writes
  behind are laid over the rows from the journal's tail in the same transaction (store/lease_tail.py);
- Redis: a second RedisStore on the same namespace used for reads only, so its flush has nothing to write and can
  never be the one to meet a newer owner's fence (that answer belongs to the core thread's commit);
- memory: no reader; the service reads through the core (the memory store is for tests and simulations).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from frontier_node.core.records import Entry, Item, Kind
from frontier_node.core.states import State
from frontier_node.store.lease_tail import lay_over, lay_over_all, tail_leases
from frontier_node.store.sqlite import ITEM_COLUMNS

_BUSY_TIMEOUT_S = 10.0
_CHUNK = 1024


class StoreReader(Protocol):
    """Committed rows and journal lines of one node's store, read without the core."""

    def items(self) -> Iterator[Item]:
        """Every item row, in first-write order, from one consistent snapshot."""
        ...

    def get(self, key: str) -> Item | None: ...

    def history(self, key: str) -> list[Entry]:
        """Every journal line of one key, in order."""
        ...

    def close(self) -> None: ...


class SqliteReader:
    """Reads an SQLite store through read-only connections of its own, one per read."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(
            f"file:{self.path.resolve()}?mode=ro", uri=True, timeout=_BUSY_TIMEOUT_S, isolation_level=None
        )
        con.execute("BEGIN")  # one snapshot for the whole read
        return con

    def items(self) -> Iterator[Item]:
        con = self._connect()
        try:
            leases = tail_leases(con)  # leases whose rows the node has not written yet
            cursor = con.execute(f"SELECT {', '.join(ITEM_COLUMNS)} FROM items ORDER BY rowid")
            while rows := cursor.fetchmany(_CHUNK):
                yield from lay_over_all(map(_item, rows), leases)
        finally:
            con.close()

    def get(self, key: str) -> Item | None:
        con = self._connect()
        try:
            row = con.execute(f"SELECT {', '.join(ITEM_COLUMNS)} FROM items WHERE key = ?", (key,)).fetchone()
            leases = tail_leases(con) if row is not None else {}
        finally:
            con.close()
        return None if row is None else lay_over(_item(row), leases)

    def history(self, key: str) -> list[Entry]:
        con = self._connect()
        try:
            rows = con.execute("SELECT * FROM journal WHERE key = ? ORDER BY seq", (key,)).fetchall()
        finally:
            con.close()
        return [Entry(*r) for r in rows]

    def close(self) -> None:
        """Nothing stays open between reads."""


def _item(row: tuple[Any, ...]) -> Item:
    values = dict(zip(ITEM_COLUMNS, row, strict=True))
    values["kind"] = Kind(values["kind"])
    values["state"] = State(values["state"])
    return Item(**values)
