"""What only the SQLite store has: its file (WAL, schema version, pragmas), batching, all-or-nothing flushes,
readers beside a writer, durability across kill -9, and open_store's URLs. The contract it shares with the
other backends is in test_store_contract.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import frontier_node
from frontier_node.core.states import State
from frontier_node.server import start_node
from frontier_node.store.memory import MemoryStore
from frontier_node.store.open import open_store, sqlite_path
from frontier_node.store.sqlite import SCHEMA_KEY, SCHEMA_VERSION, SqliteStore, StoreSchemaError
from tests.store_helpers import make_entry, make_item

REPO = Path(frontier_node.__file__).resolve().parent.parent


def test_the_last_close_checkpoints_the_wal_away(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite3"
    store = SqliteStore(path)
    it = make_item("https://h.test/a", "h.test", 0, 1)
    store.record(make_entry(1, it.key, "admitted", "schedule", "scheduled"), it)
    store.flush()
    assert Path(f"{path}-wal").exists()
    store.close()
    assert not Path(f"{path}-wal").exists()


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


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "rediss://localhost:6380/0"])
def test_open_store_says_a_node_on_redis_runs_in_a_cluster(url: str) -> None:
    message = "a node on Redis runs in a cluster: add --coordinator ADDR"
    with pytest.raises(ValueError, match=message):
        open_store(url)
    with pytest.raises(ValueError, match=message):  # what `hostring node --store redis://...` alone prints
        start_node(url, "127.0.0.1:0")


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


@given(
    st.lists(
        st.tuples(
            st.integers(0, 11),  # item
            st.sampled_from([State.SCHEDULED, State.LEASED, State.FETCHED]),
            st.integers(-1, 1),  # priority
            st.booleans(),  # flush after this write
        ),
        max_size=40,
    ),
    st.integers(-2, 1),
    st.integers(-1, 12),
    st.integers(1, 6),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_backlog_without_a_commit_matches_a_flushed_scan(
    tmp_path: Path, writes: list[tuple[int, State, int, bool]], after_priority: int, after_seq: int, limit: int
) -> None:
    """backlog() lays buffered rows over the committed ones instead of committing: its answer must be the one a
    flush and the same scan give, including rows a buffered write took out of the queue, and LIMIT cut right."""
    path = tmp_path / f"b{len(list(tmp_path.iterdir()))}.sqlite3"
    store = SqliteStore(path)
    host = "a.example"
    try:
        for seq, (i, state, priority, flush) in enumerate(writes, 1):
            key = f"http://{host}/p{i}"
            item = make_item(key, host if i < 10 else "b.example", priority, i, state)
            store.record(make_entry(seq, key, "scheduled", "lease", state.value), item)
            if flush:
                store.flush()
        after = (after_priority, after_seq)
        unflushed = [it.key for it in store.backlog(host, after, limit)]
        store.flush()
        assert unflushed == [it.key for it in store.backlog(host, after, limit)]
    finally:
        store.close()


def test_backlog_reads_deep_enough_when_buffered_writes_took_rows_out(tmp_path: Path) -> None:
    """Six committed in the queue, the first two leased but not committed: a scan of 4 still finds 4."""
    store = SqliteStore(tmp_path / "deep.sqlite3")
    try:
        keys = [f"http://a.example/p{i}" for i in range(6)]
        for i, key in enumerate(keys):
            store.record(make_entry(i + 1, key, "admitted", "schedule", "scheduled"), make_item(key, "a.example", 0, i))
        store.flush()
        for i, key in enumerate(keys[:2]):
            item = make_item(key, "a.example", 0, i, State.LEASED)
            store.record(make_entry(10 + i, key, "scheduled", "lease", "leased"), item)
        assert [it.key for it in store.backlog("a.example", (-1, 0), 4)] == keys[2:6]
    finally:
        store.close()
