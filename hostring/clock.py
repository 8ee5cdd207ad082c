"""Clocks injected into the sans-I/O core: wall time in production, a virtual one in tests."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Anything with `now()` in seconds."""

    def now(self) -> float: ...


class WallClock:
    """Unix time in seconds."""

    def now(self) -> float:
        return time.time()


class VirtualClock:
    """A clock that only moves when told to; what property tests and simulations run on."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self.t += seconds

    def set(self, t: float) -> None:
        if t < self.t:
            raise ValueError("a clock does not go backwards")
        self.t = t
