"""The embedded store of a frontier node: one SQLite file in WAL mode, written in batched transactions.

Durability: `journal_mode=WAL` with `synchronous=NORMAL`. A transaction survives a crash of the process
(`kill -9`, OOM kill, segfault) as soon as `flush()` returns: its frames are in the WAL file, which the kernel
writes out whatever happens to the process. Only an OS crash or power loss can lose the last transactions
(the WAL is fsynced at checkpoints, not at every commit), and even then the file is not corrupted. That trade
is what lets a node commit every RPC's batch without an fsync on the request path.

Writes are buffered in Python lists and committed by `flush()` in one transaction of `executemany` calls;
reads that must see buffered writes flush first. Checkpoints (copying WAL pages back into the database file,
with their fsyncs) run on a background thread with its own connection, so a commit normally only appends to
the WAL. While writes never pause, a PASSIVE checkpoint never ends with the whole WAL copied, so the WAL only
rewinds when the writer's own `wal_autocheckpoint` fires (at 256 MiB of WAL: that flush also copies the short
tail, a stall of up to a few hundred ms on a 1M-item store) or when writing pauses; `journal_size_limit` then
cuts the file back to 64 MiB.

A lease's row is written behind (store/lease_tail.py): its journal line is committed with the flush, its row
with the item's next change (most often its completion, a moment later: one row write per fetch instead of two,
and the row pages a commit dirties are most of its cost) or, after DEFER_S, with a later flush. Reads lay the
held-back rows over what they read; opening the file after a crash writes them from the journal's tail.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from mypy_extensions import mypyc_attr

from frontier_node.core.records import Entry, Item, Kind
from frontier_node.core.states import State
from frontier_node.store.lease_tail import LEASES_META, leases_value, tail_leases
from hostring.thread_names import name_os_thread

# Version 2 added items.payload (opaque client data, Link.payload); 3 the revisit columns (checked_at .. simhash).
# A file of an older version is upgraded in place when opened: the columns it lacks are added (a version-2 file of
# the revisit branch, which never shipped, had the revisit columns but no payload: it is upgraded the same way).
SCHEMA_VERSION: Final = 3
# The meta row holding the schema version; `set_meta` refuses this name so a caller cannot clobber it.
SCHEMA_KEY: Final = "hostring.store.schema_version"

ITEM_COLUMNS: Final = (
    "key", "url", "host", "origin", "domain", "kind", "depth", "priority", "seq", "redirect_hops", "state",
    "attempt", "generation", "reason", "deadline", "due_at", "status", "etag", "last_modified", "evidence",
    "digest", "source", "checked_at", "stored_at", "interval_s", "visits", "changes", "watched_s", "changed_s",
    "simhash", "payload",
)  # fmt: skip
# Columns added by a schema version, with their SQL definitions (ALTER TABLE ADD COLUMN needs a default).
_ADDED_COLUMNS: Final[dict[int, tuple[tuple[str, str], ...]]] = {
    2: (("payload", "BLOB NOT NULL DEFAULT x''"),),
    3: (
        ("checked_at", "REAL NOT NULL DEFAULT 0"), ("stored_at", "REAL NOT NULL DEFAULT 0"),
        ("interval_s", "REAL NOT NULL DEFAULT 0"), ("visits", "REAL NOT NULL DEFAULT 0"),
        ("changes", "REAL NOT NULL DEFAULT 0"), ("watched_s", "REAL NOT NULL DEFAULT 0"),
        ("changed_s", "REAL NOT NULL DEFAULT 0"), ("simhash", "INTEGER NOT NULL DEFAULT 0"),
    ),
}  # fmt: skip
JOURNAL_COLUMNS: Final = (
    "seq", "run_id", "key", "attempt", "generation", "from_state", "event", "to_state", "at",
    "policy_version", "reason", "evidence", "data",
)  # fmt: skip

# The row tuples below are positional: fail at import, not with silently shifted columns, if a record grows.
if tuple(f.name for f in dataclasses.fields(Item)) != ITEM_COLUMNS:
    raise ImportError(f"{__name__}: Item fields changed; update ITEM_COLUMNS and the schema")
if Entry._fields != JOURNAL_COLUMNS:
    raise ImportError(f"{__name__}: Entry fields changed; update JOURNAL_COLUMNS and the schema")

_SCHEMA: Final = """
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
    digest TEXT NOT NULL, source TEXT NOT NULL, checked_at REAL NOT NULL DEFAULT 0,
    stored_at REAL NOT NULL DEFAULT 0, interval_s REAL NOT NULL DEFAULT 0, visits REAL NOT NULL DEFAULT 0,
    changes REAL NOT NULL DEFAULT 0, watched_s REAL NOT NULL DEFAULT 0, changed_s REAL NOT NULL DEFAULT 0,
    simhash INTEGER NOT NULL DEFAULT 0, payload BLOB NOT NULL DEFAULT x''
);
CREATE INDEX items_backlog ON items (host, priority, seq) WHERE state = 'scheduled';
CREATE TABLE robots (origin TEXT PRIMARY KEY NOT NULL, host TEXT NOT NULL, record TEXT NOT NULL);
"""

_JOURNAL_INSERT: Final = f"INSERT INTO journal VALUES ({', '.join('?' * len(JOURNAL_COLUMNS))})"
# An upsert, not INSERT OR REPLACE: the row keeps its rowid, so items() lists rows in first-write order
# exactly as the reference store's dict does, and an update leaves the key index alone.
_ITEM_UPSERT: Final = (
    f"INSERT INTO items ({', '.join(ITEM_COLUMNS)}) VALUES ({', '.join('?' * len(ITEM_COLUMNS))}) "
    f"ON CONFLICT (key) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in ITEM_COLUMNS[1:])}"
)
_ROBOTS_UPSERT: Final = (
    "INSERT INTO robots (origin, host, record) VALUES (?, ?, ?) "
    "ON CONFLICT (origin) DO UPDATE SET host = excluded.host, record = excluded.record"
)
BREACHES_META: Final = "breaches:"
"""Meta names "breaches:<domain>" hold a domain's budget breaches as a JSON list (core.ports.BreachLog)."""
_META_UPSERT: Final = (
    "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value"
)
_ITEM_SELECT: Final = f"SELECT {', '.join(ITEM_COLUMNS)} FROM items"
_BACKLOG: Final = (
    f"{_ITEM_SELECT} INDEXED BY items_backlog WHERE host = ? AND state = 'scheduled' "
    "AND (priority, seq) > (?, ?) ORDER BY priority, seq LIMIT ?"
)

# Connection tuning (figures in the report of the store's benchmark runs): a 16 MiB page cache keeps the upper
# levels of the two host-ordered B-trees resident. Neither a larger cache (64 and 256 MiB) nor a 256 MiB mmap
# changed flush throughput measurably, while both added to the node's resident memory (the 1M-URL bench
# counted ~200 bytes per URL of them), so mmap is off and the cache is small: the OS page cache still helps.
# temp_store=MEMORY keeps GROUP BY sorts off disk. A background checkpointer with a large autocheckpoint
# backstop gave ~1.5x the flush throughput of SQLite's default (checkpoint every 1000 pages on the commit
# path). Page size stays at the default 4 KiB: 2 and 8 KiB made no difference beyond noise, since a batch
# dirties about one leaf per distinct host per index whatever the page size.
_PRAGMAS: Final = (
    "PRAGMA synchronous = NORMAL",
    "PRAGMA cache_size = -16384",
    "PRAGMA temp_store = MEMORY",
    "PRAGMA mmap_size = 0",
    "PRAGMA wal_autocheckpoint = 65536",
    "PRAGMA journal_size_limit = 67108864",
)
_PAGE_SIZE: Final = 4096
_BUSY_TIMEOUT_S: Final = 10.0
_CHECKPOINT_EVERY_S: Final = 0.25

DEFER_S: Final = 5.0
"""A lease row not written by its item's next change within this long is written by the next flush (bounds the
journal tail that opening the file after a crash reads)."""
DEFER_MAX_ROWS: Final = 100_000
"""At most this many lease rows wait unwritten; the oldest are written beyond it."""
TAIL_EVERY_S: Final = 1.0
"""The LEASES_META value moves forward at most this often (one small write per commit saved)."""
_LEASE_EVENT: Final = "lease"
_COMPACT_SLACK: Final = 64
_LEASE_TAIL_UPDATE: Final = (
    "UPDATE items SET state = 'leased', attempt = ?, generation = ?, reason = ?, deadline = ? "
    "WHERE key = ? AND generation < ?"
)

_STATE_TEXT: Final[dict[State, str]] = {s: s.value for s in State}
_TEXT_STATE: Final[dict[str, State]] = {s.value: s for s in State}
_KIND_INT: Final[dict[Kind, int]] = {k: int(k) for k in Kind}
_INT_KIND: Final[dict[int, Kind]] = {int(k): k for k in Kind}

_ItemRow = tuple[Any, ...]
_SIGN: Final = 1 << 63


def to_signed64(value: int) -> int:
    """An unsigned 64-bit number (a simhash) as the signed one SQLite's INTEGER holds (inverse: from_signed64)."""
    return value - (1 << 64) if value >= _SIGN else value


def from_signed64(value: int) -> int:
    return value + (1 << 64) if value < 0 else value


@mypyc_attr(native_class=False)  # mypyc compiles no subclass of a builtin exception
class StoreSchemaError(RuntimeError):
    """The file is not a hostring store this code can open (newer schema version, or foreign tables)."""


def _item_row(item: Item) -> _ItemRow:
    """The items-table row of an Item, enums lowered to plain values (sqlite3 binds an enum ~1 us slower)."""
    try:
        kind = _KIND_INT[item.kind]
        state = _STATE_TEXT[item.state]
    except KeyError as exc:
        raise ValueError(f"item {item.key!r}: invalid kind {item.kind!r} or state {item.state!r}") from exc
    if item.deadline != item.deadline or item.due_at != item.due_at:
        # SQLite stores NaN as NULL: refuse here rather than let every later flush fail on the NOT NULL column.
        raise ValueError(f"item {item.key!r}: NaN deadline or due_at")
    return (
        item.key, item.url, item.host, item.origin, item.domain, kind, item.depth, item.priority, item.seq,
        item.redirect_hops, state, item.attempt, item.generation, item.reason, item.deadline, item.due_at,
        item.status, item.etag, item.last_modified, item.evidence, item.digest, item.source, item.checked_at,
        item.stored_at, item.interval_s, item.visits, item.changes, item.watched_s, item.changed_s,
        to_signed64(item.simhash), item.payload,
    )  # fmt: skip


def _order(row: _ItemRow) -> tuple[int, int]:
    """(priority, seq) of an items-table row: a host's queue order."""
    return (row[7], row[8])


def _check_entry(entry: Entry) -> None:
    """Refuse a NaN time now: SQLite would store NULL and every later flush would fail on NOT NULL."""
    if entry.at != entry.at:
        raise ValueError(f"journal line {entry.seq} of {entry.key!r}: NaN time")


def _row_item(r: _ItemRow) -> Item:
    """The Item of an items-table row (inverse of _item_row)."""
    return Item(
        r[0], r[1], r[2], r[3], r[4], _INT_KIND[r[5]], r[6], r[7], r[8], r[9], _TEXT_STATE[r[10]],
        r[11], r[12], r[13], r[14], r[15], r[16], r[17], r[18], r[19], r[20], r[21], r[22], r[23], r[24],
        r[25], r[26], r[27], r[28], from_signed64(r[29]), bytes(r[30]),
    )  # fmt: skip


@mypyc_attr(native_class=False)  # compiled, a plain class: weakref.finalize needs a weak reference to it
class SqliteStore:
    """Implements core.ports.Store on one SQLite file; see the module docstring for durability.

    Thread-safe: one lock guards the buffers and the writer connection (the node calls from one thread, gRPC
    server threads may read). `batch_rows > 0` flushes automatically once that many rows are buffered.
    """

    def __init__(self, path: str | Path, *, batch_rows: int = 0) -> None:
        self.path = Path(path)
        self.batch_rows = batch_rows
        self.defer_s = DEFER_S  # how long a lease row may be held back (a test shortens it)
        self._lock = threading.Lock()
        self._journal: list[tuple[Any, ...]] = []
        self._rows: dict[str, _ItemRow] = {}
        self._host_keys: dict[str, set[str]] = {}  # host -> keys of its buffered rows, for backlog() without a commit
        # Lease rows written behind, oldest lease first: key -> (row, seq of its lease line, monotonic time of it).
        self._deferred: dict[str, tuple[_ItemRow, int, float]] = {}
        self._deferred_hosts: dict[str, set[str]] = {}  # host -> keys of its deferred rows
        self._deferred_gone = 0  # rows taken out of _deferred since it was last compacted
        self._lease_s = 0.0  # deadline - time of the deferred leases (the core's lease length)
        self._tail = (0, 0.0)  # (first seq, lease seconds) of the LEASES_META value last committed (0: none)
        self._tail_at = 0.0  # monotonic time of that commit
        self._robots: dict[str, tuple[str, str, str]] = {}
        self._meta: dict[str, str] = {}
        self._closed = False
        self._con = self._connect()
        try:
            self._prepare_schema()
            self._write_tail_leases()
        except BaseException:
            self._con.close()
            raise
        # The thread holds no reference to the store, so a store dropped without close() still stops it.
        self._stop = threading.Event()
        self._checkpointer = threading.Thread(
            target=_checkpoint_loop,
            args=(self.path, self._stop),
            name=f"checkpoint:{self.path.name}",
            daemon=True,
        )
        self._checkpointer.start()
        weakref.finalize(self, self._stop.set)

    def _connect(self) -> sqlite3.Connection:
        """A connection in autocommit mode (transactions are explicit) with the store's pragmas."""
        con = _open(self.path)
        try:
            con.execute(f"PRAGMA page_size = {_PAGE_SIZE}")  # takes effect on a new file only
            mode = con.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"{self.path}: cannot use WAL journal mode (got {mode!r})")
            for pragma in _PRAGMAS:
                con.execute(pragma)
        except sqlite3.DatabaseError as exc:
            con.close()
            raise StoreSchemaError(f"{self.path}: not a usable SQLite store: {exc}") from exc
        return con

    def _prepare_schema(self) -> None:
        """Create the schema on a new file; refuse a newer schema version or a file that is not a store."""
        con = self._con
        con.execute("BEGIN IMMEDIATE")
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        con.execute(statement)
                con.execute(_META_UPSERT, (SCHEMA_KEY, str(SCHEMA_VERSION)))
            else:
                row = None
                if "meta" in tables:
                    row = con.execute("SELECT value FROM meta WHERE name = ?", (SCHEMA_KEY,)).fetchone()
                if row is None:
                    raise StoreSchemaError(f"{self.path}: an SQLite file but not a hostring store (no version)")
                version = int(row[0])
                if version > SCHEMA_VERSION:
                    raise StoreSchemaError(
                        f"{self.path}: store schema version {version} is newer than this hostring supports "
                        f"({SCHEMA_VERSION}); upgrade hostring to open it"
                    )
                if version < SCHEMA_VERSION:
                    _migrate(con)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    # -- writes: buffered ------------------------------------------------------------------------------

    def record(self, entry: Entry, item: Item) -> None:
        """Buffer one journal line and the item's row as it stands after it (the last row per key wins). The row of
        a lease of an item with no row buffered is held back (written behind, see the module docstring)."""
        row = _item_row(item)
        _check_entry(entry)
        key = item.key
        with self._lock:
            self._journal.append(tuple(entry))  # a plain tuple: sqlite3 binds it faster than a NamedTuple
            if self._deferred and key in self._deferred:
                self._undefer(key)
            if entry.event == _LEASE_EVENT and key not in self._rows:
                self._defer(key, item.host, row, entry.seq, item.deadline - entry.at)
            else:
                self._rows[key] = row
                keys = self._host_keys.get(item.host)
                if keys is None:
                    self._host_keys[item.host] = {key}
                else:
                    keys.add(key)
            if self.batch_rows > 0 and len(self._journal) + len(self._rows) >= self.batch_rows:
                self._flush_locked()

    def _defer(self, key: str, host: str, row: _ItemRow, seq: int, lease_s: float) -> None:
        """Hold a lease's row back (its journal line is buffered); see the module docstring."""
        if self._deferred and abs(lease_s - self._lease_s) > 1e-6:
            self._write_deferred(len(self._deferred))  # one lease length per tail: the others' rows go now
        self._lease_s = lease_s
        self._deferred[key] = (row, seq, time.monotonic())
        keys = self._deferred_hosts.get(host)
        if keys is None:
            self._deferred_hosts[host] = {key}
        else:
            keys.add(key)

    def _undefer(self, key: str) -> None:
        """Forget a held-back row: a newer row of the item replaces it.

        A dict keeps the slots of deleted keys until it grows again, and iterating it (the oldest held-back row is
        its first) walks over them: with leases held back and settled all the time, that walk took ~4% of a node's
        GIL-holding samples during Lease+Complete (py-spy). The dict is copied (compactly, in the same order) once
        as many rows left it as it holds.
        """
        deferred = self._deferred
        host = deferred.pop(key)[0][2]
        keys = self._deferred_hosts[host]
        keys.discard(key)
        if not keys:
            del self._deferred_hosts[host]
        self._deferred_gone += 1
        if self._deferred_gone > len(deferred) + _COMPACT_SLACK:
            self._deferred = dict(deferred)
            self._deferred_gone = 0

    def _write_deferred(self, n: int) -> None:
        """Move the `n` oldest held-back rows to the rows the next flush writes."""
        for key in list(itertools.islice(self._deferred, n)):
            row = self._deferred[key][0]
            self._undefer(key)
            self._rows[key] = row
            keys = self._host_keys.get(row[2])
            if keys is None:
                self._host_keys[row[2]] = {key}
            else:
                keys.add(key)

    def _write_tail_leases(self) -> None:
        """On open: write the rows of leases the journal holds but the rows do not (a crash came before them)."""
        con = self._con
        con.execute("BEGIN IMMEDIATE")
        try:
            leases = tail_leases(con)
            con.executemany(
                _LEASE_TAIL_UPDATE,
                ((a, g, r, d, key, g) for key, (a, g, r, d) in leases.items()),
            )
            con.execute(_META_UPSERT, (LEASES_META, ""))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def note(self, entry: Entry) -> None:
        """Buffer a journal line that changes no row."""
        _check_entry(entry)
        with self._lock:
            self._journal.append(tuple(entry))
            if self.batch_rows > 0 and len(self._journal) + len(self._rows) >= self.batch_rows:
                self._flush_locked()

    def save_robots(self, origin: str, host: str, record: dict[str, object]) -> None:
        """Buffer the robots record of an origin, serialized to JSON now (a later mutation is not saved)."""
        text = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self._robots[origin] = (origin, host, text)

    def set_meta(self, name: str, value: str) -> None:
        """Buffer a small named value; the names of the schema version and the lease tail are reserved."""
        if name in (SCHEMA_KEY, LEASES_META):
            raise ValueError(f"meta name {name!r} is reserved for the store itself")
        with self._lock:
            self._meta[name] = value

    def flush(self) -> None:
        """Commit everything buffered in one transaction; on failure nothing is committed, the buffers stay.

        Lease rows held back stay so (their journal lines are committed), except those older than `defer_s`.
        """
        with self._lock:
            self._flush_locked()

    def _flush_locked(self, *, all_rows: bool = False) -> None:
        if self._closed:
            raise sqlite3.ProgrammingError(f"{self.path}: store is closed")
        deferred = self._deferred
        if deferred:
            if all_rows:
                self._write_deferred(len(deferred))
            else:
                oldest = time.monotonic() - self.defer_s
                late = 0
                for _, _, at in deferred.values():
                    if at > oldest:
                        break
                    late += 1
                late = max(late, len(deferred) - DEFER_MAX_ROWS)
                if late > 0:
                    self._write_deferred(late)
        tail = self._tail_due(time.monotonic())
        if tail is not None:
            self._meta[LEASES_META] = leases_value(*tail)
        else:
            self._meta.pop(LEASES_META, None)  # left by a failed flush: it may no longer cover the held-back rows
        if not (self._journal or self._rows or self._robots or self._meta):
            return
        con = self._con
        con.execute("BEGIN IMMEDIATE")
        try:
            if self._journal:
                con.executemany(_JOURNAL_INSERT, self._journal)
            if self._rows:
                con.executemany(_ITEM_UPSERT, self._rows.values())
            if self._robots:
                con.executemany(_ROBOTS_UPSERT, self._robots.values())
            if self._meta:
                con.executemany(_META_UPSERT, self._meta.items())
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        self._journal = []
        self._rows = {}
        self._host_keys = {}
        self._robots = {}
        self._meta = {}
        if tail is not None:
            self._tail, self._tail_at = tail, time.monotonic()

    def _tail_due(self, now: float) -> tuple[int, float] | None:
        """The LEASES_META value this flush must write, or None. Its seq may lag behind the oldest held-back lease
        (opening the file then reads a little more journal), never pass it: it is written at once when rows are held
        back and none is recorded (or under another lease length), else at most once per TAIL_EVERY_S."""
        if self._deferred:
            tail = (next(iter(self._deferred.values()))[1], self._lease_s)
            if self._tail[0] == 0 or self._tail[1] != tail[1]:
                return tail
        else:
            tail = (0, 0.0)
        if tail != self._tail and now - self._tail_at >= TAIL_EVERY_S:
            return tail
        return None

    def prune(self, keys: Sequence[str]) -> None:
        """Delete the rows of `keys` and their journal lines now, buffered writes first (retention).

        The journal has no index on key, so each call scans it once: the core prunes in batches, rarely.
        """
        if not keys:
            return
        with self._lock:
            self._flush_locked()
            con = self._con
            con.execute("BEGIN IMMEDIATE")
            try:
                for start in range(0, len(keys), 500):
                    chunk = tuple(keys[start : start + 500])
                    marks = ", ".join("?" * len(chunk))
                    con.execute(f"DELETE FROM items WHERE key IN ({marks})", chunk)
                    con.execute(f"DELETE FROM journal WHERE key IN ({marks})", chunk)
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise

    # -- reads -----------------------------------------------------------------------------------------

    def save_breaches(self, domain: str, breaches: Sequence[Mapping[str, object]]) -> None:
        """Buffer a domain's budget breaches (core.ports.BreachLog), kept as the meta value "breaches:<domain>"."""
        self.set_meta(BREACHES_META + domain, json.dumps(list(breaches), separators=(",", ":"), sort_keys=True))

    def load_breaches(self, domains: Iterable[str] | None = None) -> dict[str, list[dict[str, object]]]:
        """domain -> its stored budget breaches (every domain with None)."""
        with self._lock:
            self._flush_locked()
            rows = self._con.execute(
                "SELECT name, value FROM meta WHERE substr(name, 1, ?) = ?", (len(BREACHES_META), BREACHES_META)
            ).fetchall()
        wanted = None if domains is None else set(domains)
        out: dict[str, list[dict[str, object]]] = {}
        for name, value in rows:
            domain = str(name)[len(BREACHES_META) :]
            if wanted is None or domain in wanted:
                out[domain] = json.loads(value)
        return out

    def get_meta(self, name: str) -> str | None:
        """A named value; a buffered one is answered from the buffer without a flush."""
        with self._lock:
            if name in self._meta:
                return self._meta[name]
            row = self._con.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def backlog(self, host: str, after: tuple[int, int], limit: int) -> list[Item]:
        """Scheduled items of `host` with (priority, seq) > `after`, in that order: one index range scan.

        Buffered rows count without a commit (a refill in the middle of a Lease batch used to commit it): the
        committed rows, read `limit` + (buffered and held-back rows of the host) deep, with those rows laid over
        them, are exactly what a flush of everything and the same scan would give.
        """
        if limit <= 0:
            return []
        with self._lock:
            if self._closed:
                raise sqlite3.ProgrammingError(f"{self.path}: store is closed")
            keys = self._host_keys.get(host)
            held = self._deferred_hosts.get(host)
            extra = (len(keys) if keys else 0) + (len(held) if held else 0)
            rows = self._con.execute(_BACKLOG, (host, after[0], after[1], limit + extra)).fetchall()
            if extra:
                rows = [r for r in rows if not (keys and r[0] in keys) and not (held and r[0] in held)]
                over = [self._rows[k] for k in keys] if keys else []
                if held:
                    over += [self._deferred[k][0] for k in held]
                for r in over:
                    if r[10] == "scheduled" and (r[7], r[8]) > after:
                        rows.append(r)
                rows.sort(key=_order)
                del rows[limit:]
        return [_row_item(r) for r in rows]

    def get(self, key: str) -> Item | None:
        """The item row of `key`; a buffered row is answered from the buffer without a flush."""
        with self._lock:
            row = self._rows.get(key)
            if row is None and key in self._deferred:
                row = self._deferred[key][0]
            if row is None:
                row = self._con.execute(f"{_ITEM_SELECT} WHERE key = ?", (key,)).fetchone()
        return None if row is None else _row_item(row)

    def history(self, key: str) -> list[Entry]:
        """Every journal line of one key, in seq order.

        There is no index on journal.key (it cost ~40% of flush throughput), so this scans the journal, on a
        private snapshot connection so the writer is not held up: fine for inspection, not for the hot path.
        """
        rows = self._snapshot_rows("SELECT * FROM journal WHERE key = ? ORDER BY seq", (key,))
        return [Entry(*r) for r in rows]

    def journal(self, after_seq: int = 0) -> Iterator[Entry]:
        """Journal lines with seq > after_seq, in order, streamed from a snapshot taken at the call."""
        rows = self._snapshot_stream("SELECT * FROM journal WHERE seq > ? ORDER BY seq", (after_seq,))
        return (Entry(*r) for r in rows)

    def items(self, states: Iterable[State] | None = None) -> Iterator[Item]:
        """Item rows (optionally only `states`) in first-write order, streamed from a snapshot taken now."""
        if states is None:
            rows = self._snapshot_stream(f"{_ITEM_SELECT} ORDER BY rowid", ())
        else:
            wanted = sorted({_STATE_TEXT[State(s)] for s in states})
            marks = ", ".join("?" * len(wanted))
            rows = self._snapshot_stream(f"{_ITEM_SELECT} WHERE state IN ({marks}) ORDER BY rowid", tuple(wanted))
        return (_row_item(r) for r in rows)

    def scheduled_counts(self) -> dict[str, int]:
        """host -> number of scheduled items, counted from the backlog index alone."""
        rows = self._snapshot_rows(
            "SELECT host, count(*) FROM items INDEXED BY items_backlog WHERE state = 'scheduled' GROUP BY host", ()
        )
        return {str(h): int(n) for h, n in rows}

    def robots_records(self) -> Iterator[tuple[str, str, dict[str, object]]]:
        """(origin, host, record) for every saved robots record, in first-save order."""
        rows = self._snapshot_stream("SELECT origin, host, record FROM robots ORDER BY rowid", ())
        return ((str(o), str(h), json.loads(rec)) for o, h, rec in rows)

    def counts_by_state(self) -> dict[str, int]:
        """state -> number of items; scans the items table (no index on state, to keep writes cheap)."""
        rows = self._snapshot_rows("SELECT state, count(*) FROM items GROUP BY state", ())
        return {str(s): int(n) for s, n in rows}

    def max_seqs(self) -> tuple[int, int]:
        """(highest journal seq, highest item seq); the second scans the items table, once per restart."""
        ((journal_max, item_max),) = self._snapshot_rows(
            "SELECT (SELECT max(seq) FROM journal), (SELECT max(seq) FROM items)", ()
        )
        return (int(journal_max or 0), int(item_max or 0))

    def _snapshot(self) -> sqlite3.Connection:
        """A private connection holding a read transaction on the state as of now, buffers (and the lease rows held
        back) flushed first.

        A WAL reader keeps seeing the database as of its first read, so the caller gets the state at the call
        (as the reference store's lists do) while the writer goes on committing, and long scans run without
        the store's lock.
        """
        with self._lock:
            self._flush_locked(all_rows=True)
            reader = _open(self.path)
            try:
                reader.execute("BEGIN")
                reader.execute("SELECT 1 FROM meta LIMIT 1").fetchall()  # the first read pins the snapshot
            except BaseException:
                reader.close()
                raise
        return reader

    def _snapshot_rows(self, sql: str, params: tuple[object, ...]) -> list[tuple[Any, ...]]:
        """All rows of `sql` from a fresh snapshot."""
        reader = self._snapshot()
        try:
            return reader.execute(sql, params).fetchall()
        finally:
            reader.close()

    def _snapshot_stream(self, sql: str, params: tuple[object, ...]) -> Iterator[tuple[Any, ...]]:
        """Rows of `sql` from a fresh snapshot, lazily. Exhaust or drop it: an open reader holds back checkpoints."""
        reader = self._snapshot()
        try:
            cursor = reader.execute(sql, params)
        except BaseException:
            reader.close()
            raise
        return _stream(reader, cursor)

    def close(self) -> None:
        """Flush, stop the checkpointer and close; the last close checkpoints and removes the WAL file."""
        with self._lock:
            if self._closed:
                return
            try:
                self._flush_locked(all_rows=True)
            finally:
                self._closed = True
                self._stop.set()
                self._checkpointer.join()
                self._con.close()


def _migrate(con: sqlite3.Connection) -> None:
    """Bring a store of an older schema version up to this one, inside the caller's transaction: every column
    added since version 1 that the file lacks is added (by presence, so each kind of older file is upgraded)."""
    columns = {r[1] for r in con.execute("PRAGMA table_info(items)")}
    for step in sorted(_ADDED_COLUMNS):
        for name, definition in _ADDED_COLUMNS[step]:
            if name not in columns:
                con.execute(f"ALTER TABLE items ADD COLUMN {name} {definition}")
    con.execute(_META_UPSERT, (SCHEMA_KEY, str(SCHEMA_VERSION)))


def _checkpoint_loop(path: Path, stop: threading.Event) -> None:
    """Copy committed WAL frames into the database file off the commit path (PASSIVE: blocks no writer)."""
    name_os_thread()
    con = _open(path)
    try:
        while not stop.wait(_CHECKPOINT_EVERY_S):
            with contextlib.suppress(sqlite3.OperationalError):
                con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    finally:
        con.close()


def _open(path: Path) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), usable from any thread under our lock."""
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S)


def _stream(reader: sqlite3.Connection, cursor: sqlite3.Cursor) -> Iterator[tuple[Any, ...]]:
    """Yield the cursor's rows in chunks, then end the read transaction and close its connection."""
    try:
        while chunk := cursor.fetchmany(1024):
            yield from chunk
    finally:
        reader.close()
