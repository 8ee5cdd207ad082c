"""Lease rows written behind on SQLite (store/lease_tail.py): a lease's journal line is committed at once, its row
later. A process SIGKILLed between Lease and Complete leaves rows that do not show its leases yet; readers of the
file lay the journal's tail over them, and reopening the store writes them, so the leases come back exactly: a
Complete under the leased generation still settles, an expired one is leased again under a higher generation and
the old generation stays fenced.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import frontier_node
from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.records import Link, Outcome
from frontier_node.core.states import State
from frontier_node.offline_report import store_report
from frontier_node.reading import SqliteReader
from frontier_node.store.sqlite import SqliteStore
from hostring.clock import VirtualClock
from tests.store_helpers import admit, make_entry, page

REPO = Path(frontier_node.__file__).resolve().parent.parent
START = 1_000_000.0
LEASE_S = 30.0

CHILD = r"""
import json, os, signal, sys
from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.records import Kind, Link, Outcome
from frontier_node.store.sqlite import SqliteStore
from hostring.clock import VirtualClock

store = SqliteStore(sys.argv[1])
clock = VirtualClock(float(sys.argv[2]))
config = FrontierConfig(lease_s=float(sys.argv[3]), politeness=PolitenessConfig(min_delay_s=0.0))
core = Frontier(store, clock, config)
core.discover([Link(f"http://h{i}.example/p{j}") for i in range(6) for j in range(3)])
store.flush()
for it in core.lease("w", 100):
    assert it.kind is Kind.ROBOTS
    core.complete(it.key, it.generation, Outcome(status=404))
store.flush()
clock.advance(1.0)
pages = core.lease("w", 100)
store.flush()  # the Lease is answered here: its journal lines are committed
clock.advance(1.0)
for it in pages[:2]:
    assert core.complete(it.key, it.generation, Outcome(status=200)).accepted
store.flush()
held = [dict(key=it.key, generation=it.generation, attempt=it.attempt, deadline=it.deadline) for it in pages[2:]]
done = [it.key for it in pages[:2]]
print(json.dumps({"held": held, "done": done}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _config() -> FrontierConfig:
    return FrontierConfig(lease_s=LEASE_S, politeness=PolitenessConfig(min_delay_s=0.0))


def _killed_between_lease_and_complete(path: Path) -> dict[str, list]:  # type: ignore[type-arg]
    """Run the child to its SIGKILL; what it held and completed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), repr(START), repr(LEASE_S)],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr
    out: dict[str, list] = json.loads(child.stdout)  # type: ignore[type-arg]
    assert len(out["held"]) == 4 and len(out["done"]) == 2
    return out


@pytest.mark.slow
def test_sigkill_between_lease_and_complete_recovers_leases_exactly(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite3"
    out = _killed_between_lease_and_complete(path)
    held = {h["key"]: h for h in out["held"]}

    # the fault is real: the file's rows of the held items do not show their leases yet
    con = sqlite3.connect(path)
    rows = dict(con.execute(f"SELECT key, state FROM items WHERE key IN ({', '.join('?' * len(held))})", list(held)))
    con.close()
    assert set(rows.values()) == {"scheduled"}, rows

    # readers of the dead node's file see the leases: the offline report and the node's inspection reader
    report = store_report(path, dispositions=True)
    states = {row["key"]: row["state"] for row in report["dispositions"]}
    assert all(states[k] == "leased" for k in held) and all(states[k] == "fetched" for k in out["done"])
    assert report["journal"]["disagreeing_items"] == 0, report["journal"]
    reader = SqliteReader(path)
    for key, h in held.items():
        row = reader.get(key)
        assert row is not None and row.state is State.LEASED
        assert (row.generation, row.attempt, row.deadline) == (h["generation"], h["attempt"], h["deadline"])
    assert {it.key for it in reader.items() if it.state is State.LEASED} == set(held)

    # reopening writes the rows; the restarted core holds the same leases under the same generations
    clock = VirtualClock(START + 5.0)
    store = SqliteStore(path)
    core = Frontier(store, clock, _config())
    try:
        for key, h in held.items():
            row = store.get(key)
            assert row is not None and row.state is State.LEASED and row.generation == h["generation"]
            assert row.deadline == pytest.approx(h["deadline"], abs=1e-6)
        first, *rest = held.values()
        done = core.complete(first["key"], first["generation"], Outcome(status=200))
        assert done.accepted and done.state == "fetched"
        busy = {key.split("/")[2] for key in held} - {first["key"].split("/")[2]}
        for it in core.lease("w", 100):  # hosts whose fetch is still in flight send nothing
            assert it.host not in busy, it
            assert core.complete(it.key, it.generation, Outcome(status=200)).accepted
        clock.set(max(h["deadline"] for h in rest) + 1.0)
        again = {it.key: it for it in core.lease("w", 100)}
        assert {h["key"] for h in rest} <= set(again)
        for h in rest:
            assert again[h["key"]].generation == h["generation"] + 1
            stale = core.complete(h["key"], h["generation"], Outcome(status=200))
            assert not stale.accepted and stale.reason == "stale_generation"
        store.flush()
    finally:
        store.close()
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    con.close()


def test_held_back_lease_rows_read_as_leased(tmp_path: Path) -> None:
    """Before the row is written, get() answers the leased row and backlog() leaves the item out."""
    store = SqliteStore(tmp_path / "s.sqlite3")
    try:
        a, b = page("/a", "h.test", 1), page("/b", "h.test", 2)
        jseq = admit(store, admit(store, 1, a), b)
        store.flush()
        a.state, a.generation, a.attempt, a.deadline = State.LEASED, 1, 1, 1100.0
        store.record(make_entry(jseq, a.key, "scheduled", "lease", "leased", generation=1, at=1070.0), a)
        store.flush()
        got = store.get(a.key)
        assert got is not None and got.state is State.LEASED and got.generation == 1
        assert [it.key for it in store.backlog("h.test", (-1, -1), 10)] == [b.key]
        assert store.counts_by_state() == {"leased": 1, "scheduled": 1}
    finally:
        store.close()


def test_a_lease_row_held_too_long_is_written_by_a_later_flush(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store = SqliteStore(path)
    try:
        a = page("/a", "h.test", 1)
        jseq = admit(store, 1, a)
        store.flush()
        a.state, a.generation, a.deadline = State.LEASED, 1, 1100.0
        store.record(make_entry(jseq, a.key, "scheduled", "lease", "leased", generation=1, at=1070.0), a)
        store.defer_s = 0.0
        store.flush()
        con = sqlite3.connect(path)
        assert con.execute("SELECT state, generation FROM items WHERE key = ?", (a.key,)).fetchall() == [("leased", 1)]
        meta = con.execute("SELECT value FROM meta WHERE name = 'hostring.store.leases_from'").fetchall()
        con.close()
        assert meta == [("",)]  # no lease lacks its row: a reopen reads no journal tail
    finally:
        store.close()


def test_the_lease_tail_meta_is_reserved(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.sqlite3")
    try:
        with pytest.raises(ValueError, match="reserved"):
            store.set_meta("hostring.store.leases_from", "[1, 2.0]")
    finally:
        store.close()


def test_a_drained_crawl_reopens_with_the_same_rows(tmp_path: Path) -> None:
    """A whole crawl on SQLite through the core ends with the same rows after a clean close and reopen."""
    path = tmp_path / "c.sqlite3"
    clock = VirtualClock(START)
    store = SqliteStore(path)
    core = Frontier(store, clock, _config())
    core.discover([Link(f"http://h{i}.example/p{j}") for i in range(4) for j in range(5)])
    store.flush()
    while not core.drained:
        items = core.lease("w", 100)
        store.flush()
        for it in items:
            core.complete(it.key, it.generation, Outcome(status=404 if "robots" in it.key else 200))
        store.flush()
        clock.advance(0.5)
    before = {it.key: it for it in store.items()}
    store.close()
    store = SqliteStore(path)
    try:
        assert {it.key: it for it in store.items()} == before
        assert {it.state for it in before.values()} == {State.FETCHED}
    finally:
        store.close()
