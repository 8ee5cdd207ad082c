"""The reference loop: a fixed pure-Python workload whose CPU time per step says how fast this machine runs Python,
alone and with every CPU busy at once (`python -m bench.reference START` is one of the busy processes)."""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

_STEPS = 100_000
_ROOT = Path(__file__).resolve().parent.parent


def _round_s(n: int) -> float:
    """CPU seconds of one round of `n` steps (dict, str, int work)."""
    start = time.process_time()
    table: dict[str, int] = {}
    for i in range(n):
        key = "u" + str(i & 4095)
        table[key] = table.get(key, 0) + i
    return time.process_time() - start


def reference_loop_ns(rounds: int = 5, n: int = _STEPS) -> float:
    """CPU nanoseconds per step of the loop, the best of `rounds`.

    Machines of the same name differ by 3x from one session to the next: this figure lets two runs' absolute
    rates be compared (a rate scales roughly with 1 / this), and CPU time is used so that load does not move it.
    """
    best = math.inf
    for _ in range(rounds):
        best = min(best, _round_s(n))
    return round(1e9 * best / n, 1)


def reference_loop_busy_ns() -> float:
    """The loop's CPU ns per step (median of rounds) run in one process per usable CPU at once.

    On a VM whose CPUs share a physical core, the same work costs more CPU time while every CPU is busy: a crawl
    whose processes overlap more (a faster one) then shows more CPU per page for the same work. This figure next
    to `reference_loop_ns` says by how much.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    start = time.time() + 0.5
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.reference", str(start)], cwd=_ROOT, stdout=subprocess.PIPE, text=True
        )
        for _ in range(cpus)
    ]
    values = [float(p.communicate(timeout=60)[0]) for p in procs]
    return round(sum(values) / len(values), 1)


def _busy_child(start: float) -> float:
    """One busy process: wait for the common start, then the median of seven rounds (a round that ran before or
    after the others would read low, and the median ignores it)."""
    while time.time() < start:
        time.sleep(0.001)
    return 1e9 * statistics.median(_round_s(_STEPS) for _ in range(7)) / _STEPS


if __name__ == "__main__":
    print(_busy_child(float(sys.argv[1])))
