"""A host's queue in RAM: admission fills part of a window, leasing refills whole ones, order and counts unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.records import Kind, Link, Outcome
from frontier_node.store.memory import MemoryStore
from frontier_node.store.sqlite import SqliteStore
from hostring.clock import VirtualClock


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_admission_keeps_part_of_a_window_and_leases_in_admission_order(backend: str, tmp_path: Path) -> None:
    store = MemoryStore() if backend == "memory" else SqliteStore(tmp_path / "w.sqlite3")
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0), window=6, admission_window=3)
    f = Frontier(store, VirtualClock(), config)
    urls = [f"http://a.example/p{i}" for i in range(20)]
    f.discover([Link(u) for u in urls])
    store.flush()
    stats = f.stats()
    assert stats.queued == 21 and stats.queued_in_ram == 3, "admission holds 3 in RAM, 17 in the store (+ robots)"
    leased: list[str] = []
    most_in_ram = 0
    while batch := f.lease("w", 10):
        for item in batch:
            if item.kind is Kind.PAGE:
                leased.append(item.url)
            assert f.complete(item.key, item.generation, Outcome(status=404)).accepted
        store.flush()
        most_in_ram = max(most_in_ram, f.stats().queued_in_ram)
    assert leased == urls, "every URL once, in admission order, across refills"
    assert 3 < most_in_ram <= 6, "a refill loads up to a whole window"
    assert f.drained
    store.close()


def test_admission_window_never_exceeds_the_window() -> None:
    store = MemoryStore()
    f = Frontier(store, VirtualClock(), FrontierConfig(window=2, admission_window=8))
    f.discover([Link(f"http://a.example/p{i}") for i in range(5)])
    assert f.stats().queued_in_ram == 2
