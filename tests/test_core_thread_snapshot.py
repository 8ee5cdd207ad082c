"""Stats after a committed call shows that call: the snapshot's rate limit counts the core thread's CPU, not the
wall time a loaded machine adds (a test of the shell's own logic, from source only: it stands a slow frontier in)."""

from __future__ import annotations

import threading
import time

from frontier_node.core.config import FrontierConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.records import Link
from frontier_node.core.views import FrontierStats
from frontier_node.core_thread import CoreThread
from frontier_node.store.memory import MemoryStore
from hostring.clock import VirtualClock


class _Descheduled:
    """A frontier whose stats() takes 0.2 s of wall time and no CPU, as when its thread waits for a core."""

    def __init__(self) -> None:
        self.core = Frontier(MemoryStore(), VirtualClock(), FrontierConfig())

    def stats(self) -> FrontierStats:
        time.sleep(0.2)
        return self.core.stats()


def test_a_slow_wall_clock_snapshot_does_not_hide_a_later_write() -> None:
    slow = _Descheduled()
    core = CoreThread(slow, threading.Condition())  # type: ignore[arg-type]  # only stats() is asked
    first = core.snapshot
    assert first.stats.hosts == 0
    slow.core.discover([Link("http://a.example/")])
    core.version += 1  # a call committed since the snapshot, as the thread counts it
    time.sleep(0.05)  # well past 10 x the snapshot's CPU (~1 ms), well within 10 x its wall time (2 s)
    again = core._publish()
    assert again is not first, "a snapshot older than a committed call answered Stats"
    assert again.stats.hosts == 1
