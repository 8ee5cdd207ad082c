"""The SQLite store against the reference MemoryStore: same answers, plus durability across kill -9 and reopen."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import frontier_node
from frontier_node.core.ports import Store
from frontier_node.core.records import Entry, Item, Kind
from frontier_node.core.states import State
from frontier_node.store.memory import MemoryStore
from frontier_node.store.open import open_store, sqlite_path
from frontier_node.store.sqlite import SCHEMA_KEY, SCHEMA_VERSION, SqliteStore, StoreSchemaError

REPO = Path(frontier_node.__file__).resolve().parent.parent


def make_item(key: str, host: str, priority: int, seq: int, state: State = State.SCHEDULED, **kw: Any) -> Item:
    """An item with the identity fields filled in from key and host."""
    return Item(
        key=key, url=key, host=host, origin=f"https://{host}", domain=host.split(".", 1)[-1], kind=Kind.PAGE,
        depth=1, priority=priority, seq=seq, state=state, **kw,
    )  # fmt: skip


def make_entry(seq: int, key: str, frm: str, event: str, to: str, **kw: Any) -> Entry:
    """A journal line with the bookkeeping fields defaulted."""
    fields: dict[str, Any] = {"run_id": "run-1", "attempt": 0, "generation": 0, "at": 1000.0 + seq}
    fields.update(policy_version=1, reason="", evidence="")
    fields.update(kw)
    return Entry(seq=seq, key=key, from_state=frm, event=event, to_state=to, **fields)


def snapshot(store: Store, keys: list[str], hosts: list[str], metas: list[str]) -> dict[str, object]:
    """Every read method's answer, for comparing two stores."""
    out: dict[str, object] = {
        "journal": list(store.journal()),
        "journal_after_3": list(store.journal(3)),
        "items": list(store.items()),
        "items_sched_leased": list(store.items([State.SCHEDULED, State.LEASED])),
        "items_none": list(store.items([])),
        "scheduled_counts": store.scheduled_counts(),
        "counts_by_state": store.counts_by_state(),
        "robots": list(store.robots_records()),
        "max_seqs": store.max_seqs(),
    }
    for k in keys:
        item = out[f"get:{k}"] = store.get(k)
        out[f"history:{k}"] = store.history(k)
        if item is not None:  # the strict bound: starting from an existing item's own order excludes it
            out[f"backlog_after:{k}"] = store.backlog(item.host, item.order, 3)
            out[f"backlog_before:{k}"] = store.backlog(item.host, (item.priority, item.seq - 1), 2)
    for h in hosts:
        out[f"backlog:{h}"] = store.backlog(h, (-(10**9), -1), 1000)
    for m in metas:
        out[f"meta:{m}"] = store.get_meta(m)
    return out


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each backend in turn, so the contract tests state one behaviour for both."""
    s: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "node.sqlite3")
    yield s
    s.close()


# -- the contract, stated once for every backend ---------------------------------------------------------


def test_backlog_orders_by_priority_then_seq_with_strict_after_and_limit(store: Store) -> None:
    rows = [("a", 2, 1), ("b", 1, 5), ("c", 1, 2), ("d", 0, 9), ("e", 1, 3)]
    for i, (name, prio, seq) in enumerate(rows, 1):
        it = make_item(f"https://h.test/{name}", "h.test", prio, seq)
        store.record(make_entry(i, it.key, "admitted", "schedule", "scheduled"), it)
    other = make_item("https://o.test/x", "o.test", 0, 4)
    store.record(make_entry(9, other.key, "admitted", "schedule", "scheduled"), other)
    leased = make_item("https://h.test/leased", "h.test", 0, 1, State.LEASED)
    store.record(make_entry(10, leased.key, "scheduled", "lease", "leased"), leased)

    def names(after: tuple[int, int], limit: int) -> list[str]:
        return [i.key.rsplit("/", 1)[1] for i in store.backlog("h.test", after, limit)]

    assert names((-1, 0), 10) == ["d", "c", "e", "b", "a"]
    assert names((1, 2), 10) == ["e", "b", "a"]  # strictly after (1, 2): c itself is excluded
    assert names((1, 3), 2) == ["b", "a"]
    assert names((0, 9), 1) == ["c"]  # a lower seq at a higher priority still comes after
    assert names((-1, 0), 2) == ["d", "c"]
    assert names((2, 1), 10) == []
    assert names((-1, 0), 0) == []
    assert store.backlog("nobody.test", (-1, 0), 10) == []


def test_reads_see_buffered_writes_and_answer_alike(store: Store) -> None:
    it = make_item("https://h.test/1", "h.test", 1, 1, State.ADMITTED)
    store.record(make_entry(1, it.key, "discovered", "admit", "admitted", data='{"depth":1}'), it)
    it.state = State.SCHEDULED
    store.record(make_entry(2, it.key, "admitted", "schedule", "scheduled"), it)
    it.priority = 99  # a change after record() must not leak into the stored row
    store.note(make_entry(3, "https://unknown.test/", "discovered", "reject", "rejected", reason="scope"))
    two = make_item("https://h.test/2", "h.test", 0, 2, State.FETCHED, status=200, evidence="urn:uuid:1")
    store.record(make_entry(4, two.key, "leased", "complete", "fetched", evidence="urn:uuid:1"), two)
    store.save_robots("https://h.test", "h.test", {"status": 200, "rules": ["Disallow: /x"], "fetched_at": 1.5})
    store.save_robots("https://h.test", "h.test", {"status": 404})
    store.save_robots("http://g.test:8080", "g.test", {"status": 500, "delay": None})
    store.set_meta("run_id", "run-1")
    store.set_meta("run_id", "run-2")

    got = store.get(it.key)
    assert got is not None and got.state is State.SCHEDULED and got.priority == 1 and got.kind is Kind.PAGE
    assert store.get("https://nope.test/") is None
    assert store.get_meta("run_id") == "run-2" and store.get_meta("absent") is None
    assert [e.seq for e in store.history(it.key)] == [1, 2]
    assert store.history(it.key)[0].data == '{"depth":1}'
    assert [e.seq for e in store.journal()] == [1, 2, 3, 4]
    assert [e.seq for e in store.journal(2)] == [3, 4]
    assert [i.key for i in store.items()] == [it.key, two.key]
    assert [i.key for i in store.items([State.FETCHED])] == [two.key]
    assert list(store.items([State.FAILED])) == []
    assert store.scheduled_counts() == {"h.test": 1}
    assert store.counts_by_state() == {"scheduled": 1, "fetched": 1}
    assert list(store.robots_records()) == [
        ("https://h.test", "h.test", {"status": 404}),
        ("http://g.test:8080", "g.test", {"status": 500, "delay": None}),
    ]
    assert store.max_seqs() == (4, 2)
    store.flush()
    assert store.get(it.key) == got


def test_iterators_are_snapshots_taken_at_the_call(store: Store) -> None:
    a = make_item("https://h.test/a", "h.test", 0, 1)
    store.record(make_entry(1, a.key, "admitted", "schedule", "scheduled"), a)
    store.flush()
    journal, items = store.journal(), store.items()
    b = make_item("https://h.test/b", "h.test", 0, 2)
    store.record(make_entry(2, b.key, "admitted", "schedule", "scheduled"), b)
    a.state = State.LEASED
    store.record(make_entry(3, a.key, "scheduled", "lease", "leased"), a)
    store.flush()
    assert [e.seq for e in journal] == [1]
    assert [(i.key, i.state) for i in items] == [(a.key, State.SCHEDULED)]


def test_empty_store_answers(store: Store) -> None:
    assert store.max_seqs() == (0, 0)
    assert list(store.journal()) == [] and list(store.items()) == [] and list(store.robots_records()) == []
    assert store.scheduled_counts() == {} and store.counts_by_state() == {}
    assert store.history("k") == [] and store.backlog("h", (0, 0), 5) == []
    store.flush()


# -- property: SqliteStore answers exactly as MemoryStore ------------------------------------------------

KEYS = [f"https://h{i % 3}.test/p{i}" for i in range(7)]
HOSTS = ["h0.test", "h1.test", "h2.test"]
METAS = ["run_id", "scope", "seq.hi"]
small_text = st.text(max_size=6)
finite = st.floats(allow_nan=False, width=64)

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("record"),
            st.integers(0, len(KEYS) - 1),
            st.sampled_from(HOSTS),
            st.integers(-2, 2),
            st.sampled_from(list(State)),
            st.booleans(),  # give the item a fresh seq
            st.fixed_dictionaries(
                {
                    "attempt": st.integers(0, 5),
                    "generation": st.integers(0, 2**63 - 1),
                    "deadline": finite,
                    "due_at": finite,
                    "status": st.integers(-(2**63), 2**63 - 1),
                    "reason": small_text,
                    "etag": small_text,
                    "digest": small_text,
                    "kind": st.sampled_from(list(Kind)),
                }
            ),
            small_text,  # journal data
        ),
        st.tuples(st.just("note"), st.integers(0, len(KEYS) - 1), small_text),
        st.tuples(
            st.just("robots"),
            st.sampled_from(["https://h0.test", "https://h1.test", "http://h2.test:81"]),
            st.sampled_from(HOSTS),
            st.dictionaries(
                st.text(max_size=4),
                st.one_of(st.none(), st.booleans(), st.integers(-5, 5), finite, small_text),
                max_size=3,
            ),
        ),
        st.tuples(st.just("meta"), st.sampled_from(METAS), small_text),
        st.tuples(st.just("flush")),
        st.tuples(
            st.just("backlog"),
            st.sampled_from(HOSTS),
            st.integers(0, len(KEYS) - 1),
            st.integers(-1, 1),
            st.integers(-1, 1),
            st.integers(0, 8),
        ),
        st.tuples(st.just("get"), st.integers(0, len(KEYS) - 1)),
    ),
    max_size=40,
)


class Driver:
    """Applies one op sequence to a store, numbering journal lines and item seqs as the core would."""

    def __init__(self) -> None:
        self.jseq = 0
        self.iseq = 0
        self.item_seq: dict[str, int] = {}
        self.order: dict[str, tuple[int, int]] = {}

    def apply(self, store: Store, op: tuple[Any, ...]) -> object:
        kind = op[0]
        if kind == "record":
            _, k, host, prio, state, reseq, extra, data = op
            key = KEYS[k]
            if reseq or key not in self.item_seq:
                self.iseq += 1
                self.item_seq[key] = self.iseq
            self.jseq += 1
            it = make_item(
                key, host, prio, self.item_seq[key], state, **{n: v for n, v in extra.items() if n != "kind"}
            )
            it.kind = extra["kind"]
            self.order[key] = it.order
            store.record(make_entry(self.jseq, key, "scheduled", "lease", state.value, data=data), it)
        elif kind == "note":
            self.jseq += 1
            store.note(make_entry(self.jseq, KEYS[op[1]], "leased", "late_evidence", "leased", evidence=op[2]))
        elif kind == "robots":
            store.save_robots(op[1], op[2], op[3])
        elif kind == "meta":
            store.set_meta(op[1], op[2])
        elif kind == "flush":
            store.flush()
        elif kind == "backlog":  # `after` lands on, just below or just above a known item's order
            _, host, k, dp, ds, limit = op
            prio, seq = self.order.get(KEYS[k], (0, 0))
            return store.backlog(host, (prio + dp, seq + ds), limit)
        elif kind == "get":
            return store.get(KEYS[op[1]])
        return None


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops)
def test_sqlite_answers_like_memory(ops: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.sqlite3"
        mem, sql = MemoryStore(), SqliteStore(path)
        d_mem, d_sql = Driver(), Driver()
        try:
            for op in ops:
                assert d_sql.apply(sql, op) == d_mem.apply(mem, op), op
            assert snapshot(sql, KEYS, HOSTS, METAS) == snapshot(mem, KEYS, HOSTS, METAS)
        finally:
            sql.close()
        reopened = SqliteStore(path)
        try:
            assert snapshot(reopened, KEYS, HOSTS, METAS) == snapshot(mem, KEYS, HOSTS, METAS)
        finally:
            reopened.close()


# -- SQLite specifics --------------------------------------------------------------------------------------


def test_reopen_preserves_everything(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite3"
    store, mem = SqliteStore(path), MemoryStore()
    d_sql, d_mem = Driver(), Driver()
    script: list[tuple[Any, ...]] = [
        ("record", i, HOSTS[i % 3], i % 2, list(State)[i % len(State)], False, {"kind": Kind.PAGE}, f"d{i}")
        for i in range(len(KEYS))
    ]
    script += [("robots", "https://h0.test", "h0.test", {"allow": True}), ("meta", "run_id", "r7"), ("note", 2, "x")]
    for op in script:
        d_sql.apply(store, op)
        d_mem.apply(mem, op)
    store.close()
    store.close()  # idempotent
    assert not Path(f"{path}-wal").exists()  # the last close checkpoints the WAL away
    again = SqliteStore(path)
    try:
        assert snapshot(again, KEYS, HOSTS, METAS) == snapshot(mem, KEYS, HOSTS, METAS)
        assert again.get_meta("run_id") == "r7"
    finally:
        again.close()


def test_batch_rows_flushes_automatically(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite3"
    store = SqliteStore(path, batch_rows=10)
    try:
        for i in range(1, 5):
            it = make_item(f"https://h.test/{i}", "h.test", 0, i)
            store.record(make_entry(i, it.key, "admitted", "schedule", "scheduled"), it)
        with sqlite3.connect(path) as peek:
            assert peek.execute("SELECT count(*) FROM journal").fetchone() == (0,)
        it = make_item("https://h.test/5", "h.test", 0, 5)
        store.record(make_entry(5, it.key, "admitted", "schedule", "scheduled"), it)  # 5 lines + 5 rows
        with sqlite3.connect(path) as peek:
            assert peek.execute("SELECT count(*) FROM journal").fetchone() == (5,)
            assert peek.execute("SELECT count(*) FROM items").fetchone() == (5,)
    finally:
        store.close()


def test_failed_flush_commits_nothing(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "node.sqlite3")
    a = make_item("https://h.test/a", "h.test", 0, 1)
    store.record(make_entry(1, a.key, "admitted", "schedule", "scheduled"), a)
    store.flush()
    b = make_item("https://h.test/b", "h.test", 0, 2)
    store.record(make_entry(2, b.key, "admitted", "schedule", "scheduled"), b)
    store.note(make_entry(1, a.key, "scheduled", "late_evidence", "scheduled"))  # duplicate journal seq
    store.set_meta("run_id", "r")
    with pytest.raises(sqlite3.IntegrityError):
        store.flush()
    with sqlite3.connect(store.path) as peek:
        assert peek.execute("SELECT count(*) FROM journal").fetchone() == (1,)
        assert peek.execute("SELECT key FROM items").fetchall() == [(a.key,)]
        assert peek.execute("SELECT count(*) FROM meta WHERE name = 'run_id'").fetchone() == (0,)
    with pytest.raises(sqlite3.IntegrityError):
        store.close()  # the buffers were kept, so close() reports the same failure rather than losing them


def test_nan_times_are_refused_at_the_call(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "node.sqlite3")
    try:
        it = make_item("https://h.test/a", "h.test", 0, 1, due_at=float("nan"))
        with pytest.raises(ValueError, match="NaN"):
            store.record(make_entry(1, it.key, "leased", "retry", "retryable"), it)
        with pytest.raises(ValueError, match="NaN"):
            store.note(make_entry(1, it.key, "leased", "late_evidence", "leased", at=float("nan")))
        store.flush()  # nothing poisoned the buffers
        assert list(store.journal()) == []
    finally:
        store.close()


def test_set_meta_refuses_the_schema_key(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "node.sqlite3")
    try:
        with pytest.raises(ValueError, match="reserved"):
            store.set_meta(SCHEMA_KEY, "99")
    finally:
        store.close()


def test_file_layout_and_pragmas(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite3"
    SqliteStore(path).close()
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert con.execute("SELECT value FROM meta WHERE name = ?", (SCHEMA_KEY,)).fetchone() == (str(SCHEMA_VERSION),)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"journal", "items", "robots", "meta"} <= tables
        plan = con.execute(
            "EXPLAIN QUERY PLAN SELECT * FROM items WHERE host = ? AND state = 'scheduled' "
            "AND (priority, seq) > (?, ?) ORDER BY priority, seq LIMIT ?",
            ("h", 0, 0, 5),
        ).fetchall()
        detail = " ".join(str(r[-1]) for r in plan)
        assert "items_backlog" in detail and "TEMP B-TREE" not in detail, detail


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite3"
    SqliteStore(path).close()
    with sqlite3.connect(path) as con:
        con.execute("UPDATE meta SET value = ? WHERE name = ?", (str(SCHEMA_VERSION + 1), SCHEMA_KEY))
    with pytest.raises(StoreSchemaError, match=rf"schema version {SCHEMA_VERSION + 1} is newer"):
        SqliteStore(path)


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite3"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE t (x)")
    with pytest.raises(StoreSchemaError, match="not a hostring store"):
        SqliteStore(other)
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not a database, " * 100)
    with pytest.raises(StoreSchemaError, match="not a usable SQLite store"):
        SqliteStore(junk)


def test_concurrent_readers_while_writing(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "node.sqlite3")
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set():
                store.backlog("h.test", (-1, 0), 50)
                store.scheduled_counts()
                sum(1 for _ in store.journal())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(1, 2001):
            it = make_item(f"https://h.test/{i}", "h.test", i % 3, i)
            store.record(make_entry(i, it.key, "admitted", "schedule", "scheduled"), it)
            if i % 100 == 0:
                store.flush()
    finally:
        done.set()
        for t in threads:
            t.join()
    assert errors == []
    assert store.scheduled_counts() == {"h.test": 2000}
    store.close()


# -- durability across kill -9 ---------------------------------------------------------------------------

CHILD = r"""
import json, sys, time
from frontier_node.core.records import Entry, Item, Kind
from frontier_node.core.states import State
from frontier_node.store.sqlite import SqliteStore

path, batches, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
store = SqliteStore(path)
jseq = 0

def admit(b, i):
    global jseq
    key = f"https://h{i % 50}.test/{b}/{i}"
    it = Item(key=key, url=key, host=f"h{i % 50}.test", origin=f"https://h{i % 50}.test", domain="test",
              kind=Kind.PAGE, depth=1, priority=i % 4, seq=b * 1000 + i, state=State.ADMITTED)
    jseq += 1
    store.record(Entry(jseq, "r", key, 0, 0, "discovered", "admit", "admitted", 1.0, 1, "", "", str(b)), it)
    it.state = State.SCHEDULED
    jseq += 1
    store.record(Entry(jseq, "r", key, 0, 0, "admitted", "schedule", "scheduled", 1.0, 1, "", "", str(b)), it)

b = 0
while mode == "race" or b < batches:
    for i in range(256):
        admit(b, i)
    store.set_meta("last_batch", str(b))
    store.flush()
    print(json.dumps({"flushed": b, "jseq": jseq}), flush=True)
    b += 1
for i in range(100):
    admit(b, i)  # buffered, never flushed
print(json.dumps({"buffering": b}), flush=True)
time.sleep(60)
"""


def run_child(path: Path, batches: int, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(batches), mode], stdout=subprocess.PIPE, text=True, env=env
    )


def check_recovered(path: Path) -> tuple[int, int]:
    """Reopen after a kill: the file is sound and holds whole batches only. Returns (batches, journal rows)."""
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    store = SqliteStore(path)
    try:
        lines = list(store.journal())
        assert [e.seq for e in lines] == list(range(1, len(lines) + 1))
        assert len(lines) % 512 == 0, "a batch is committed whole or not at all"
        batches = len(lines) // 512
        assert store.counts_by_state() == ({"scheduled": batches * 256} if batches else {})
        assert {e.data for e in lines} == {str(b) for b in range(batches)}
        assert store.get_meta("last_batch") == (str(batches - 1) if batches else None)
        assert store.max_seqs() == (len(lines), (batches - 1) * 1000 + 255 if batches else 0)
        assert sum(store.scheduled_counts().values()) == batches * 256
        return batches, len(lines)
    finally:
        store.close()


@pytest.mark.slow
def test_kill_9_after_flush_keeps_every_flushed_row(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite3"
    child = run_child(path, 6, "stop")
    assert child.stdout is not None
    flushed = None
    for line in child.stdout:
        msg = json.loads(line)
        if "flushed" in msg:
            flushed = msg
        if "buffering" in msg:
            break
    child.send_signal(signal.SIGKILL)
    assert child.wait(10) == -signal.SIGKILL
    assert flushed == {"flushed": 5, "jseq": 6 * 512}
    assert Path(f"{path}-wal").exists()  # killed, not closed: recovery has a WAL to replay
    assert check_recovered(path) == (6, 6 * 512)


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.004, 0.011])
def test_kill_9_mid_stream_leaves_whole_batches(tmp_path: Path, delay: float) -> None:
    path = tmp_path / "node.sqlite3"
    child = run_child(path, 0, "race")
    assert child.stdout is not None
    last = -1
    deadline = time.monotonic() + 20
    for line in child.stdout:  # kill at an arbitrary point after a few commits, likely mid-flush
        last = json.loads(line)["flushed"]
        if last >= 8 or time.monotonic() > deadline:
            break
    time.sleep(delay)
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    batches, _ = check_recovered(path)
    assert batches >= last + 1  # every flush the child reported survived


# -- open_store ---------------------------------------------------------------------------------------------


def test_open_store_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rel = open_store("sqlite:///data/nodes/n1.sqlite3")
    assert isinstance(rel, SqliteStore) and rel.path == Path("data/nodes/n1.sqlite3")
    rel.close()
    assert (tmp_path / "data" / "nodes" / "n1.sqlite3").is_file()
    absolute = tmp_path / "abs" / "n2.sqlite3"
    store = open_store(f"sqlite:///{absolute}")  # an absolute path after three slashes: four in all
    assert isinstance(store, SqliteStore) and store.path == absolute
    store.close()
    assert sqlite_path("sqlite:////var/lib/n.sqlite3") == Path("/var/lib/n.sqlite3")
    assert isinstance(open_store("memory://"), MemoryStore)


@pytest.mark.parametrize(
    "url",
    ["", "postgres://db/x", "sqlite://relative.sqlite3", "sqlite:relative", "sqlite:///", "sqlite:///dir/",
     "sqlite:///x.sqlite3?mode=ro", "memory://somewhere", "file:///tmp/x.sqlite3"],
)  # fmt: skip
def test_open_store_rejects_bad_urls(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"sqlite|memory"):
        open_store(url)


def test_open_store_redis_is_not_yet(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError, match="arrives with the cluster work"):
        open_store("redis://localhost:6379/0")


# -- throughput figure (printed, never asserted) -------------------------------------------------------------


def test_print_flush_throughput(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Batches of 256 admitted links (2 journal lines + 1 item row each), every link on another of 10k hosts.

    That spread is the worst case (each row dirties its own index leaves); prints rows/s by wall clock and by
    the flushing thread's CPU time, which is what survives a busy shared machine.
    """
    store = SqliteStore(tmp_path / "bench.sqlite3")
    jseq = 0
    wall = cpu = 0.0
    batches = 120
    for b in range(batches):
        for i in range(256):
            host = f"host{(b * 7919 + i * 104729) % 10_000}.example"
            it = make_item(f"https://{host}/p/{b}/{i}", host, i % 8, b * 256 + i, State.ADMITTED)
            store.record(make_entry(jseq + 1, it.key, "discovered", "admit", "admitted", data=it.url), it)
            it = dataclasses.replace(it, state=State.SCHEDULED)
            store.record(make_entry(jseq + 2, it.key, "admitted", "schedule", "scheduled"), it)
            jseq += 2
        start, start_cpu = time.perf_counter(), time.thread_time()
        store.flush()
        wall += time.perf_counter() - start
        cpu += time.thread_time() - start_cpu
    store.close()
    rows = batches * 256 * 3
    with capsys.disabled():
        print(
            f"\n[sqlite store] flush of {batches} batches x 256 links (2 journal + 1 item row each, 10k hosts): "
            f"{rows / wall:,.0f} rows/s wall = {batches * 256 / wall:,.0f} links/s; "
            f"{rows / cpu:,.0f} rows/s per CPU-second of the flushing thread"
        )
