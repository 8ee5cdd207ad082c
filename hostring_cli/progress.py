"""The live line of `hostring crawl`: what the crawl does now, and, when nothing can go, what it waits for.

On a terminal the line is redrawn in place, cut to the terminal's width, and log records print above it
(`hostring.logs.StatusLine`); off a terminal a plain line is written every few seconds.
"""

from __future__ import annotations

import os
import re
import time
from typing import TextIO

from hostring import logs
from hostring.v1 import frontier_pb2 as pb

LEGEND = (
    "The live line shows: fetched (responses, robots.txt included) and per second, queue (URLs waiting their "
    "turn), flight (fetches under way), hosts (ready now / with work), err (fetches that failed) and the time "
    "taken; when nothing can go for a while, 'waiting until HH:MM:SS: ...' names what the crawl waits for (a "
    "retry, a host's delay)."
)
_OFF_TTY_EVERY_S = 5.0


def clock(seconds: float) -> str:
    """H:MM:SS for a duration."""
    s = int(max(0.0, seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def since(seconds: float) -> str:
    """A short duration: 42s, 12m03s, 5h02m."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s // 60 % 60:02d}m"


def short(n: int) -> str:
    """A count in at most 5 characters: 9999, 12k, 10.0M."""
    if n < 10_000:
        return str(n)
    if n < 999_500:
        return f"{n / 1000:.0f}k"
    return f"{n / 1_000_000:.1f}M"


def wall(unix: float) -> str:
    """HH:MM:SS local time, with the date when it is not today."""
    day = time.strftime("%Y-%m-%d", time.localtime(unix))
    text = time.strftime("%H:%M:%S", time.localtime(unix))
    return text if day == time.strftime("%Y-%m-%d") else f"{day} {text}"


def waiting(stats: pb.StatsResponse) -> str:
    """'waiting until HH:MM:SS: WHAT' when no work can go for a while and nothing is in flight; '' otherwise."""
    if stats.in_flight or stats.next_ready_s <= 1.5 or not stats.waiting_for:
        return ""
    what = re.sub(r"\bhttps?://", "", stats.waiting_for)
    return f"waiting until {wall(time.time() + stats.next_ready_s)}: {what}"


def render(stats: pb.StatsResponse, fetched: int, errors: int, elapsed: float) -> str:
    """The progress line (at most 79 columns; the waiting text may make it longer, and it is then cut)."""
    wait = waiting(stats)
    if wait:
        return f"queue {short(stats.queued)}  {wait}"
    rate = fetched / max(elapsed, 1e-9)
    per_s = f"{rate:.0f}/s" if rate >= 10 else f"{rate:.1f}/s"
    ready = f"{short(stats.hosts_ready)}/{short(stats.hosts_with_work)}"
    return (
        f"fetched {short(fetched)} {per_s}  queue {short(stats.queued)}  flight {stats.in_flight}  "
        f"hosts {ready}  err {short(errors)}  {since(elapsed)}"
    )


class Progress:
    """Draws the line; `note()` prints a line above it (or plainly, off a terminal)."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self.tty = enabled and _isatty(stream)
        self.t0 = time.monotonic()
        self.last_print = 0.0
        self.status = logs.StatusLine(stream) if self.tty else None
        if self.status is not None:
            logs.set_status_line(self.status)

    def update(self, stats: pb.StatsResponse, fetched: int, errors: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        line = render(stats, fetched, errors, now - self.t0)
        if self.status is not None:
            self.status.show(line[: max(20, _columns(self.stream) - 1)])
        elif now - self.last_print >= _OFF_TTY_EVERY_S:
            self.last_print = now
            self.stream.write(line + "\n")
            self.stream.flush()

    def note(self, line: str) -> None:
        """A message for the operator (stopping, resuming): above the live line, never through it."""
        if self.status is not None:
            self.status.print(line)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.status is not None:
            self.status.close()
            logs.set_status_line(None)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 80
