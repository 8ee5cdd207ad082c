"""Lease rows written behind: what the journal's tail says of leases whose item rows are not written yet.

A lease changes only a few fields of its item's row (state, attempt, generation, reason, deadline), and most
leases end with a completion a moment later, which writes the whole row again. The SQLite store therefore
commits a lease's journal line at once (the lease is durable when the Lease call is answered) but writes its
row only with the item's next change, or at a later commit once it has waited long enough (`SqliteStore`).

Every commit also writes the meta value LEASES_META: the journal seq from which lease lines may still lack
their rows, and the lease length that turns a line's time into its deadline (deadline = at + lease_s, as the
core grants it). A lease line whose generation is above its item row's is a lease the row does not show yet;
laid over the row it gives exactly the row the store would have written. The store applies that to its rows
when it opens (after `kill -9`); readers of a live or dead store's file lay it over what they read.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from frontier_node.core.records import Item
from frontier_node.core.states import State

LEASES_META = "hostring.store.leases_from"
"""Meta value: JSON [first journal seq whose lease line may lack its row, lease seconds], or "" when none may."""


class TailLease(NamedTuple):
    """A lease that only the journal shows: the fields it sets on its item's row."""

    attempt: int
    generation: int
    reason: str
    deadline: float


def leases_value(first_seq: int, lease_s: float) -> str:
    """The LEASES_META value for lease lines from `first_seq` on (0: none lacks its row)."""
    return json.dumps([first_seq, lease_s]) if first_seq > 0 else ""


def tail_leases(con: sqlite3.Connection) -> dict[str, TailLease]:
    """key -> its last lease line at or after the meta's seq, read inside the caller's transaction. Whether a line
    is ahead of its row is for `lay_over` (or the caller) to decide, by generation."""
    row = con.execute("SELECT value FROM meta WHERE name = ?", (LEASES_META,)).fetchone()
    if row is None or not row[0]:
        return {}
    first_seq, lease_s = json.loads(row[0])
    lines = con.execute(
        "SELECT key, attempt, generation, reason, at FROM journal WHERE seq >= ? AND event = 'lease' ORDER BY seq",
        (int(first_seq),),
    )
    return {str(k): TailLease(int(a), int(g), str(r), float(at) + float(lease_s)) for k, a, g, r, at in lines}


def lay_over(item: Item, leases: dict[str, TailLease]) -> Item:
    """`item` as its row would read with its tail lease written (changed in place), if the lease is ahead of it."""
    lease = leases.get(item.key)
    if lease is not None and item.generation < lease.generation:
        item.state = State.LEASED
        item.attempt, item.generation, item.reason, item.deadline = lease
    return item


def lay_over_all(items: Iterable[Item], leases: dict[str, TailLease]) -> Iterator[Item]:
    """`lay_over` applied to each item (nothing to do when no lease lacks its row)."""
    if not leases:
        yield from items
        return
    for item in items:
        yield lay_over(item, leases)
