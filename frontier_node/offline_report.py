"""The coverage report of a crawl read straight from its SQLite store, without starting a node.

`hostring report --store sqlite:///PATH` uses it on a finished crawl, or on a running one: the file is opened
read-only and read inside one transaction, so items and journal come from one consistent snapshot and the
node writing it is not disturbed. Leases whose rows the node writes behind (or had not written when it was
killed) are laid over the rows from the journal's tail (store/lease_tail.py). The counts are
`frontier_node.report.coverage_report`'s own (it is given a `CoverageInput` built from the file), and the journal
adds what only it knows: how many times each identity was leased, and whether its last journal entry agrees with
its current state.

What the node kept in memory is in the store too: Discover verdicts (meta "counters.verdicts", written with each
Discover) and budget breaches (meta "breaches:<domain>", per domain so they travel with a handoff). A store written
by a node that kept no verdicts lacks them: `not_in_store` names what is missing (`hostring report --node` asks a
live node instead).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

from frontier_node.core.records import Item, Kind
from frontier_node.core.states import State
from frontier_node.core.views import CoverageInput
from frontier_node.report import coverage_report
from frontier_node.store.lease_tail import lay_over_all, tail_leases
from frontier_node.store.sqlite import BREACHES_META, ITEM_COLUMNS, from_signed64

NOT_IN_STORE = ("suppressed_by_rule", "discovered_by_verdict")
_VERDICTS = "counters.verdicts"  # the meta name the core writes (core/frontier.py)
_EXAMPLES = 10


class StoreReadError(RuntimeError):
    """The path is not a readable hostring SQLite store."""


def store_path(url: str) -> Path:
    """The file of a `sqlite:///PATH` store URL (a bare path is accepted too)."""
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///") :])
    if "://" in url:
        raise StoreReadError(f"only sqlite:///PATH stores can be read offline, not {url!r}")
    return Path(url)


# The report needs no client payloads. A file of an older schema (read-only here, so never upgraded) lacks the
# columns added since (payload, the revisit numbers): the rows read keep their defaults.
_REPORT_COLUMNS = tuple(c for c in ITEM_COLUMNS if c != "payload")


def _item(columns: list[str], row: tuple[Any, ...]) -> Item:
    """An Item from a row of `columns`."""
    values = dict(zip(columns, row, strict=True))
    values["kind"] = Kind(values["kind"])
    values["state"] = State(values["state"])
    if "simhash" in values:
        values["simhash"] = from_signed64(values["simhash"])
    return Item(**values)


def _connect(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise StoreReadError(f"no store at {path}")
    try:
        con = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True, timeout=10, isolation_level=None)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as e:
        raise StoreReadError(f"{path}: not a readable SQLite store: {e}") from e
    if not {"items", "journal", "meta"} <= tables:
        con.close()
        raise StoreReadError(f"{path}: not a hostring store (tables {sorted(tables)})")
    return con


def store_report(path: Path, *, dispositions: bool = False) -> dict[str, Any]:
    """The coverage report of the store at `path`, plus journal-derived attempts and a consistency check."""
    con = _connect(path)
    try:
        con.execute("BEGIN")  # one read snapshot for items, journal and meta
        run_row = con.execute("SELECT value FROM meta WHERE name = 'run_id'").fetchone()
        counters = dict(con.execute("SELECT name, value FROM meta WHERE name = ?", (_VERDICTS,)))
        present = {r[1] for r in con.execute("PRAGMA table_info(items)")}
        columns = [c for c in _REPORT_COLUMNS if c in present]
        rows = con.execute(f"SELECT {', '.join(columns)} FROM items ORDER BY rowid")
        items = list(lay_over_all([_item(columns, r) for r in rows], tail_leases(con)))
        revisits = Counter(
            {
                str(reason).removeprefix("revisit:"): n
                for reason, n in con.execute(
                    "SELECT reason, COUNT(*) FROM journal WHERE (event = 'complete' AND reason LIKE 'revisit:%') "
                    "OR (event = 'fail' AND reason = 'gone') GROUP BY reason"
                )
            }
        )
        leases = Counter(dict(con.execute("SELECT key, COUNT(*) FROM journal WHERE event = 'lease' GROUP BY key")))
        last = dict(
            con.execute(
                "SELECT j.key, j.to_state FROM journal j "
                "JOIN (SELECT key, MAX(seq) AS seq FROM journal GROUP BY key) m ON j.key = m.key AND j.seq = m.seq"
            )
        )
        entries = con.execute("SELECT COUNT(*) FROM journal").fetchone()[0]
        stored = con.execute(
            "SELECT value FROM meta WHERE substr(name, 1, ?) = ?", (len(BREACHES_META), BREACHES_META)
        ).fetchall()
        con.execute("COMMIT")
    except sqlite3.DatabaseError as e:
        raise StoreReadError(f"{path}: cannot read the store: {e}") from e
    finally:
        con.close()
    verdicts = None
    try:
        if _VERDICTS in counters:
            verdicts = {(str(v), str(r)): int(n) for v, r, n in json.loads(counters[_VERDICTS])}
        breaches = [b for (value,) in stored for b in json.loads(value)]
    except (ValueError, TypeError) as e:
        raise StoreReadError(f"{path}: unreadable counters in the store's meta table: {e}") from e
    breaches.sort(key=lambda b: (-int(b.get("count", 0)), str(b.get("rule")), str(b.get("pattern"))))
    source = CoverageInput(
        str(run_row[0]) if run_row else "", items, breaches, verdicts, revisit_outcomes=dict(revisits)
    )
    report = coverage_report(source, dispositions=dispositions)
    pages = [it for it in items if it.kind is Kind.PAGE and it.state is not State.REJECTED]
    per_page = {it.key: leases.get(it.key, 0) for it in pages}
    if dispositions:
        for row in report["dispositions"]:
            row["leases"] = per_page.get(row["key"], 0)
    most = sorted(((n, k) for k, n in per_page.items() if n > 1), reverse=True)[:_EXAMPLES]
    report["attempts"] = {
        "leases_per_identity": {str(n): c for n, c in sorted(Counter(per_page.values()).items())},
        "leased_more_than_once": sum(1 for n in per_page.values() if n > 1),
        "most_leased": [{"key": k, "leases": n} for n, k in most],
    }
    disagree = [it for it in items if last.get(it.key, it.state.value) != it.state.value]
    report["journal"] = {
        "entries": entries,
        "disagreeing_items": len(disagree),
        "examples": [{"key": it.key, "state": it.state.value, "journal": last[it.key]} for it in disagree[:5]],
    }
    report["source"] = {"store": str(path), "read_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    report["not_in_store"] = [name for name in NOT_IN_STORE if name not in report]
    return report
