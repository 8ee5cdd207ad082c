"""`hostring crawl`: a whole polite crawl in one process tree — a node child process on SQLite and a worker.

The node runs in its own process so the scheduler and the fetcher each get a core. The node dies with its
parent (PR_SET_PDEATHSIG), its store survives anything, and `--resume` picks the crawl up where it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc

from fetch_worker.fetch import Fetcher, FetchLimits
from fetch_worker.metrics import WorkerMetrics
from fetch_worker.netpolicy import NetworkPolicy
from fetch_worker.warc import WarcWriter
from fetch_worker.worker import Worker
from hostring.client import StaticRouter
from hostring.metrics import serve_metrics
from hostring.urls import UrlRejected, identify
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from hostring_cli.revisit import revisit_summary

STORE_NAME = "frontier.sqlite3"
_PORT_LINE = re.compile(r"listening on port (\d+)")


class CrawlError(Exception):
    """A crawl that cannot start: bad seeds, an occupied output directory, a node that did not come up."""


@dataclass
class CrawlOptions:
    """Everything `hostring crawl` was told."""

    seeds: list[str]
    out: Path
    scope: str = "domain"
    scope_file: Path | None = None
    allow_network: list[str] = field(default_factory=list)
    delay: float = 1.0
    concurrency: int = 1
    max_pages: int | None = None
    max_depth: int = 20
    max_pages_per_host: int = 10_000
    user_agent: str = ""
    resume: bool = False
    fetchers: int = 64
    lease_s: float = 120.0
    progress: bool = True
    total_timeout_s: float = 60.0
    max_bytes: int = 10 * 2**20
    metrics_port: int | None = None
    log_format: str = "text"
    node_args: list[str] = field(default_factory=list)
    duration_s: float | None = None  # --duration: stop cleanly after this long and report (exit 0)


def read_seeds(urls: list[str], seeds_file: Path | None) -> list[str]:
    """Seeds from the command line and a file (one per line, # comments), each checked to be a crawlable URL."""
    seeds = list(urls)
    if seeds_file is not None:
        try:
            text = seeds_file.read_text(encoding="utf-8")
        except OSError as e:
            raise CrawlError(f"cannot read seeds file {seeds_file}: {e.strerror}") from e
        seeds += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    bad = []
    for seed in seeds:
        try:
            identify(seed)
        except UrlRejected as e:
            bad.append(f"  {seed!r}: {e.reason.value}")
    if bad:
        raise CrawlError("these seeds are not crawlable URLs:\n" + "\n".join(bad))
    return seeds


def _die_with_parent() -> None:
    """In the child: receive SIGKILL when the parent dies, so a killed crawl leaves no orphan node."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start_node_process(opts: CrawlOptions, log: TextIO) -> tuple[subprocess.Popen[str], str]:
    """Start `hostring node` on the crawl's store and a free loopback port; return it and its address."""
    scope = (
        ["--scope", opts.scope]
        if opts.scope_file is None
        else ["--scope", "list", "--scope-file", str(opts.scope_file)]
    )
    cmd = [
        sys.executable,
        "-m",
        "hostring_cli",
        "--log-level",
        "WARNING",
        "--log-format",
        opts.log_format,
        "node",
        "--store",
        f"sqlite:///{(opts.out / STORE_NAME).resolve()}",
        "--listen",
        "127.0.0.1:0",
        "--delay",
        str(opts.delay),
        "--concurrency",
        str(opts.concurrency),
        "--max-depth",
        str(opts.max_depth),
        "--max-pages-per-host",
        str(opts.max_pages_per_host),
        "--lease-s",
        str(opts.lease_s),
        *scope,
        *(["--max-pages", str(opts.max_pages)] if opts.max_pages is not None else []),
        *(["--user-agent", opts.user_agent] if opts.user_agent else []),
        *(["--metrics-port", str(opts.metrics_port + 1)] if opts.metrics_port is not None else []),
        *opts.node_args,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=_die_with_parent)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = _PORT_LINE.search(line)
    if not m:
        proc.kill()
        raise CrawlError(f"the frontier node did not start (see {opts.out / 'node.log'}): {line.strip()!r}")
    return proc, f"127.0.0.1:{m.group(1)}"


class Progress:
    """A one-line live display: pages, rate, queue depth, hosts waiting, errors (a line every 5 s off a TTY)."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self.tty = stream.isatty()
        self.t0 = time.monotonic()
        self.last_print = 0.0

    def update(self, stats: pb.StatsResponse, worker: Worker) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not self.tty and now - self.last_print < 5.0:
            return
        self.last_print = now
        elapsed = max(now - self.t0, 1e-9)
        by_state = dict(stats.urls_by_state)
        done = by_state.get("fetched", 0) + by_state.get("failed", 0) + by_state.get("suppressed", 0)
        errors = sum(worker.stats.errors.values())
        line = (
            f"pages {worker.stats.fetched:>6}  {worker.stats.fetched / elapsed:6.1f}/s  done {done:>6}  "
            f"queued {stats.queued:>6}  in flight {stats.in_flight:>3}  hosts waiting "
            f"{stats.hosts_with_work - stats.hosts_ready:>4}/{stats.hosts_with_work:<4} errors {errors:>4}  "
            f"{elapsed:6.0f}s"
        )
        if self.tty:
            self.stream.write("\r" + line[: os.get_terminal_size(self.stream.fileno()).columns - 1])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")


def summarize(report: dict[str, Any]) -> str:
    """The human summary printed at the end of a crawl."""
    lines = [f"run {report['run_id']}: {report['admitted']} admitted URLs"]
    lines.append("  by state:  " + ", ".join(f"{k} {v}" for k, v in report["by_state"].items()))
    if report["fetched_by_status"]:
        lines.append("  fetched by status:  " + ", ".join(f"{k} {v}" for k, v in report["fetched_by_status"].items()))
    lines.append(f"  robots denials: {report['robots_denied']['count']}")
    if report["failures_by_class"]:
        lines.append("  failures: " + ", ".join(f"{k} {v}" for k, v in report["failures_by_class"].items()))
    for b in report["suppressed_by_rule"][:10]:
        lines.append(f"  suppressed by {b['rule']} ({b['pattern']}): {b['count']}, first {b['first_example']}")
    unresolved = report["unresolved"]
    lines.append(f"  unresolved: {unresolved['count']}")
    for u in unresolved["items"][:10]:
        lines.append(f"    {u['url']}  {u['state']} {u['reason']}")
    lines += revisit_summary(report)
    return "\n".join(lines)


async def _crawl(opts: CrawlOptions, address: str, stop: asyncio.Event, out: TextIO) -> dict[str, Any] | None:
    """Seed the node, run the worker until the node drains (or stop is set), and fetch the report."""
    channel = grpc.aio.insecure_channel(address)
    stub = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
    await stub.Discover(pb.DiscoverRequest(links=[pb.Link(observed=s, seed=True) for s in opts.seeds]), timeout=30)
    limits = FetchLimits(
        total_timeout_s=opts.total_timeout_s,
        max_bytes=opts.max_bytes,
        max_decoded_bytes=max(opts.max_bytes * 2, 20 * 2**20),
    )
    fetcher = Fetcher(NetworkPolicy(opts.allow_network), opts.user_agent, limits, max_connections=opts.fetchers)
    token = opts.user_agent.split("/")[0].split()[0] if opts.user_agent else "hostring"
    metrics = None
    if opts.metrics_port is not None:
        metrics = WorkerMetrics()
        serve_metrics(opts.metrics_port, metrics.registry, "127.0.0.1:0")
    worker = Worker(
        StaticRouter(address),
        fetcher,
        warc=WarcWriter(opts.out / "warc"),
        max_in_flight=opts.fetchers,
        product_token=token,
        worker_id=f"crawl-{os.getpid()}",
        metrics=metrics,
    )
    progress = Progress(sys.stderr, opts.progress)
    finished = asyncio.Event()

    async def show() -> None:
        while not finished.is_set():
            with contextlib.suppress(grpc.aio.AioRpcError):
                progress.update(await stub.Stats(pb.StatsRequest(), timeout=5), worker)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), 0.5)

    shower = asyncio.create_task(show())
    timed_out = asyncio.Event()  # --duration: a continuous crawl never drains; it ends cleanly after that long
    timer = None
    if opts.duration_s is not None:

        def time_is_up() -> None:
            timed_out.set()
            stop.set()

        timer = asyncio.get_running_loop().call_later(opts.duration_s, time_is_up)
    try:
        await worker.run(stop, until_drained=True)
    finally:
        if timer is not None:
            timer.cancel()
        finished.set()
        await shower
        progress.close()
        await worker.close()
    if stop.is_set() and not timed_out.is_set():
        await channel.close(None)
        return None
    report: dict[str, Any] = json.loads((await stub.Report(pb.ReportRequest(dispositions=True), timeout=300)).json)
    await channel.close(None)
    return report


def run_crawl(opts: CrawlOptions, out: TextIO = sys.stdout) -> int:
    """Run the crawl to its end (0), or until Ctrl-C/SIGTERM (130, resumable with --resume)."""
    opts.out.mkdir(parents=True, exist_ok=True)
    store = opts.out / STORE_NAME
    if store.exists() and not opts.resume:
        raise CrawlError(f"{opts.out} already holds a crawl; pass --resume to continue it or choose another --out")
    if opts.resume and not store.exists():
        raise CrawlError(f"nothing to resume in {opts.out}")
    with open(opts.out / "node.log", "a", encoding="utf-8") as log:
        node, address = start_node_process(opts, log)
        try:
            loop = asyncio.new_event_loop()
            stop = asyncio.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            report = loop.run_until_complete(_crawl(opts, address, stop, out))
            loop.close()
        finally:
            node.terminate()
            try:
                node.wait(timeout=15)
            except subprocess.TimeoutExpired:
                node.kill()
    if report is None:
        print(f"stopped; continue with: hostring crawl --resume --out {opts.out} ...", file=out)
        return 130
    (opts.out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True), encoding="utf-8")
    print(summarize(report), file=out)
    print(f"report: {opts.out / 'report.json'}   WARC: {opts.out / 'warc'}", file=out)
    return 0
