"""A store that keeps everything in dicts: the reference backend for tests and simulations."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence

from frontier_node.core.records import Entry, Item
from frontier_node.core.states import State


class MemoryStore:
    """Implements core.ports.Store without durability; journal and rows are plain Python lists and dicts."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.rows: dict[str, Item] = {}
        self.robots: dict[str, tuple[str, dict[str, object]]] = {}
        self.meta: dict[str, str] = {}
        self.breaches: dict[str, list[dict[str, object]]] = {}
        self.flushes = 0

    def record(self, entry: Entry, item: Item) -> None:
        self.entries.append(entry)
        self.rows[item.key] = dataclasses.replace(item)

    def note(self, entry: Entry) -> None:
        self.entries.append(entry)

    def save_robots(self, origin: str, host: str, record: dict[str, object]) -> None:
        self.robots[origin] = (host, record)

    def set_meta(self, name: str, value: str) -> None:
        self.meta[name] = value

    def save_breaches(self, domain: str, breaches: Sequence[Mapping[str, object]]) -> None:
        self.breaches[domain] = [dict(b) for b in breaches]

    def load_breaches(self, domains: Iterable[str] | None = None) -> dict[str, list[dict[str, object]]]:
        wanted = None if domains is None else set(domains)
        return {d: [dict(b) for b in bs] for d, bs in self.breaches.items() if wanted is None or d in wanted}

    def get_meta(self, name: str) -> str | None:
        return self.meta.get(name)

    def flush(self) -> None:
        self.flushes += 1

    def prune(self, keys: Sequence[str]) -> None:
        gone = set(keys)
        for key in gone:
            self.rows.pop(key, None)
        self.entries = [e for e in self.entries if e.key not in gone]

    def backlog(self, host: str, after: tuple[int, int], limit: int) -> list[Item]:
        rows = [r for r in self.rows.values() if r.host == host and r.state is State.SCHEDULED and r.order > after]
        rows.sort(key=lambda r: r.order)
        return [dataclasses.replace(r) for r in rows[:limit]]

    def get(self, key: str) -> Item | None:
        row = self.rows.get(key)
        return dataclasses.replace(row) if row else None

    def history(self, key: str) -> list[Entry]:
        return [e for e in self.entries if e.key == key]

    def journal(self, after_seq: int = 0) -> Iterator[Entry]:
        return iter([e for e in self.entries if e.seq > after_seq])

    def items(self, states: Iterable[State] | None = None) -> Iterator[Item]:
        wanted = set(states) if states is not None else None
        return iter([dataclasses.replace(r) for r in self.rows.values() if wanted is None or r.state in wanted])

    def scheduled_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.rows.values():
            if r.state is State.SCHEDULED:
                counts[r.host] = counts.get(r.host, 0) + 1
        return counts

    def robots_records(self) -> Iterator[tuple[str, str, dict[str, object]]]:
        return iter([(origin, host, rec) for origin, (host, rec) in self.robots.items()])

    def counts_by_state(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.rows.values():
            counts[r.state.value] = counts.get(r.state.value, 0) + 1
        return counts

    def max_seqs(self) -> tuple[int, int]:
        return (
            max((e.seq for e in self.entries), default=0),
            max((r.seq for r in self.rows.values()), default=0),
        )

    def close(self) -> None:
        pass
