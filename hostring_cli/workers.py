"""`hostring crawl --workers N`: the crawl's further fetch worker processes, and the counts they report.

The crawl's own process is one worker; each further one is a `hostring worker --node ADDR --until-drained`
child, so fetching, parsing and archiving a crawl of many hosts spread over more cores. Politeness stays the
node's: one request in flight per host whichever worker holds the lease. Each child rewrites a small JSON file
with its counts every second and when it ends (`write_counts`), which the crawl adds to its own for the live line
and the summary. Children run in their own process group (Ctrl-C in a terminal reaches the crawl alone, which
passes each stop on as SIGTERM: the first lets their fetches finish, the second hands them back) and die with
the crawl if it is killed (--exit-with-parent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from hostring_cli.parent import hostring_command

if TYPE_CHECKING:
    from fetch_worker.metrics import WorkerMetrics
    from fetch_worker.worker import Worker

MAX_WORKERS = 256
"""The most worker processes `hostring crawl --workers` starts: more than the cores of any one machine, and a
typo (--workers 100000) is refused instead of starting that many processes."""

COUNTS_EVERY_S = 1.0
"""How often a worker child rewrites its counts file."""


@dataclass(frozen=True)
class Counts:
    """What one worker did: responses (robots.txt included), failed fetches, requests made, bytes received."""

    fetched: int = 0
    errors: int = 0
    requests: int = 0
    bytes: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.fetched + other.fetched,
            self.errors + other.errors,
            self.requests + other.requests,
            self.bytes + other.bytes,
        )


def worker_counts(worker: Worker, metrics: WorkerMetrics | None) -> Counts:
    """A worker's counts now (requests only when it keeps metrics)."""
    stats = worker.stats
    requests = metrics.requests if metrics is not None else 0
    return Counts(stats.fetched, sum(stats.errors.values()), requests, stats.bytes)


def write_counts(path: Path, counts: Counts) -> None:
    """Replace `path` with `counts` as JSON, atomically (a reader never sees half a file)."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(asdict(counts)), encoding="utf-8")
    os.replace(part, path)


def read_counts(path: Path) -> Counts:
    """The counts a worker last wrote to `path`; zero before it wrote any."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Counts()
    return Counts(**{k: int(data.get(k, 0)) for k in ("fetched", "errors", "requests", "bytes")})


@dataclass(frozen=True)
class WorkerSettings:
    """What every worker child of one crawl is started with (the crawl's own fetch settings)."""

    address: str
    warc_dir: Path
    allow_network: tuple[str, ...]
    user_agent: str
    fetchers: int
    fetch_timeout_s: float
    max_bytes: int
    grace_s: float
    log_format: str
    metrics_port: int | None  # the first child's port; the next ones count up from it


def worker_command(s: WorkerSettings, index: int, counts: Path) -> list[str]:
    """`hostring worker` for the crawl's child number `index` (1, 2, ...): its own id, WARC prefix and counts."""
    return [
        *hostring_command(s.log_format),
        "worker",
        "--node",
        s.address,
        "--until-drained",
        "--id",
        f"crawl-{os.getpid()}-{index}",
        "--out",
        str(s.warc_dir),
        "--fetchers",
        str(s.fetchers),
        "--fetch-timeout",
        str(s.fetch_timeout_s),
        "--max-response-bytes",
        str(s.max_bytes),
        "--grace",
        str(s.grace_s),
        *(["--user-agent", s.user_agent] if s.user_agent else []),
        *[arg for cidr in s.allow_network for arg in ("--allow-network", cidr)],
        *(["--metrics-port", str(s.metrics_port + index - 1)] if s.metrics_port is not None else []),
        "--counts-file",
        str(counts),
        "--exit-with-parent",
        str(os.getpid()),
    ]


class WorkerProcesses:
    """The crawl's worker children: started together, told to stop, waited for, their counts summed."""

    def __init__(self, settings: WorkerSettings, n: int, run_dir: Path, log: IO[str]) -> None:
        self.settings = settings
        self.n = n
        self.run_dir = run_dir
        self.log = log
        self.procs: list[subprocess.Popen[bytes]] = []
        self.counts_files: list[Path] = []
        self.reported: set[int] = set()  # children whose unexpected end was told already
        self.stops = 0

    def start(self) -> None:
        """Start the children (none for n = 0)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTRING_")}  # the crawl's flags only
        for i in range(1, self.n + 1):
            counts = self.run_dir / f"worker-{i}.json"
            counts.unlink(missing_ok=True)
            self.counts_files.append(counts)
            proc = subprocess.Popen(
                worker_command(self.settings, i, counts),
                stdout=self.log,
                stderr=self.log,
                stdin=subprocess.DEVNULL,
                process_group=0,
                env=env,
            )
            self.procs.append(proc)

    def counts(self) -> Counts:
        """The children's counts as they last wrote them."""
        total = Counts()
        for path in self.counts_files:
            total += read_counts(path)
        return total

    def ended_early(self) -> list[tuple[int, int]]:
        """(child number, exit code) of children that ended with an error and were not told of yet."""
        out = []
        for i, proc in enumerate(self.procs, 1):
            code = proc.poll()
            if code not in (None, 0) and i not in self.reported:
                self.reported.add(i)
                out.append((i, code))
        return out

    def stop(self) -> None:
        """Pass a stop on: the first lets the children's fetches finish (within --grace), the second hands them
        back at once."""
        self.stops += 1
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)

    def running(self) -> bool:
        return any(proc.poll() is None for proc in self.procs)

    async def close(self, wait_s: float) -> None:
        """Give the children `wait_s` to end by themselves (a drained crawl: each sees it), stop those still
        running and give them --grace more, then kill what is left: nothing outlives the crawl."""
        await self._wait(wait_s)
        if self.running():
            if self.stops == 0:
                self.stop()
            await self._wait(self.settings.grace_s + 5.0)
        self.kill()
        for proc in self.procs:
            proc.wait()

    def kill(self) -> None:
        """End every child now (the node they lease from is gone: nothing they hold can be settled)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()

    async def _wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.running() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
