"""`hostring crawl`: a whole polite crawl in one process tree — a node child process on SQLite and a worker.

The node runs in its own process (so the scheduler and the fetcher each get a core) and its own process group,
so that Ctrl-C in a terminal reaches only this process, which stops the crawl in order: the first Ctrl-C (or
SIGTERM) stops leasing and lets the fetches in flight finish, a second hands them back at once; then the report
is taken and the node is stopped. The node dies with its parent (PR_SET_PDEATHSIG); its store survives anything,
and `--resume` continues with the settings stored in OUT, handing back at once any lease a killed run held.
"""

from __future__ import annotations

import asyncio
import contextlib
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

from fetch_worker.fetch import Fetcher, body_limits
from fetch_worker.metrics import WorkerMetrics
from fetch_worker.netpolicy import NetworkPolicy
from fetch_worker.warc import WarcWriter, finalize_open_files
from fetch_worker.worker import Worker
from frontier_node.core.config import RevisitConfig
from hostring.agent import product_token
from hostring.client import StaticRouter
from hostring.limits import grpc_options
from hostring.metrics import serve_metrics
from hostring.text import escape_tree
from hostring.urls import UrlRejected, identify
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from hostring_cli.args import EXIT_NOTHING_FETCHED, EXIT_OK, EXIT_STOPPED, MAX_RESPONSE_BYTES, UsageError, read_text
from hostring_cli.crawldir import STORE_NAME, CrawlDir, Made
from hostring_cli.errors import DependencyError
from hostring_cli.parent import hostring_command
from hostring_cli.progress import Progress
from hostring_cli.revisit import revisit_node_args, revisit_settings
from hostring_cli.settings import run_record, toml_value
from hostring_cli.summary import Finish, summarize
from hostring_cli.workers import Counts, WorkerProcesses, WorkerSettings, worker_counts

__all__ = ["STORE_NAME", "CrawlError", "CrawlOptions", "read_seeds", "run_crawl", "summarize"]

_PORT_LINE = re.compile(r"listening on port (\d+)")
_UNFINISHED = ("scheduled", "retryable", "leased")
_CHILDREN_DRAIN_S = 30.0
"""How long a drained crawl waits for its worker children to see it and end before stopping them."""


class CrawlError(UsageError):
    """A crawl that cannot start: bad seeds, an occupied output directory (a usage error: exit 2)."""


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
    workers: int = 1  # fetch worker processes: this one and workers - 1 children (hostring_cli/workers.py)
    lease_s: float = 120.0
    progress: bool = True
    total_timeout_s: float = 60.0
    max_bytes: int = MAX_RESPONSE_BYTES
    metrics_port: int | None = None
    log_format: str = "text"
    node_args: list[str] = field(default_factory=list)
    idle_exit_s: float = 60.0  # end when the only work left cannot start for longer than this (0: never)
    grace_s: float = 30.0  # on the first Ctrl-C, how long fetches in flight may take to finish
    reconsider: list[str] = field(default_factory=list)  # policy refusals to schedule again (a wider policy)
    settings: dict[str, Any] = field(default_factory=dict)  # what OUT/crawl.toml records (key -> value)
    runs: list[dict[str, Any]] = field(default_factory=list)  # the history kept in OUT/crawl.toml
    notice: str = ""  # one line for the operator once the crawl starts (what a resume runs with)
    revisit: RevisitConfig = field(default_factory=RevisitConfig)  # the node's policy (revisit_node_args)
    duration_s: float | None = None  # --duration: stop cleanly after this long and report (exit 0)


_SHOWN_SEEDS = 10  # a refused seeds file is named by its first few bad lines, each cut short: one readable line
_SHOWN_CHARS = 200


def read_seeds(urls: list[str], seeds_file: Path | None) -> list[str]:
    """Seeds from the command line and a file (one per line, # comments), each checked to be a crawlable URL."""
    seeds = list(urls)
    if seeds_file is not None:
        text = read_text(seeds_file, "--seeds-file")
        seeds += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    bad = []
    for seed in seeds:
        try:
            identify(seed)
        except UrlRejected as e:
            shown = seed if len(seed) <= _SHOWN_CHARS else f"{seed[:_SHOWN_CHARS]}...({len(seed):,} characters)"
            bad.append(f"{shown!r} ({e.reason.value})")
    if bad:
        listed = "; ".join(bad[:_SHOWN_SEEDS]) + (
            f"; and {len(bad) - _SHOWN_SEEDS} more" if len(bad) > _SHOWN_SEEDS else ""
        )
        raise CrawlError(f"not a crawlable URL: {listed}; give http:// or https:// URLs")
    return seeds


# ---------------------------------------------------------------------------------------------- the node child


def node_command(opts: CrawlOptions) -> list[str]:
    """`hostring node` on the crawl's store and a free loopback port, with the crawl's politeness."""
    scope = ["--scope", opts.scope] if opts.scope_file is None else ["--scope", str(opts.scope_file.resolve())]
    return [
        *hostring_command(opts.log_format),
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
        *revisit_node_args(opts.revisit),
        "--exit-with-parent",
        str(os.getpid()),
        *opts.node_args,
    ]


def start_node_process(opts: CrawlOptions, log: TextIO) -> tuple[subprocess.Popen[str], str]:
    """Start the node in its own process group; return it and its address once it listens."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTRING_")}
    proc = subprocess.Popen(
        node_command(opts),
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
        text=True,
        process_group=0,  # Ctrl-C in the terminal goes to the crawl only; it stops the node in its own time
        env=env,  # the crawl gives its settings as flags; a private node reads no HOSTRING_* (nor an admin token)
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = _PORT_LINE.search(line)
    if not m:
        proc.kill()
        proc.wait()
        log.flush()
        last = _last_line(opts.out / "node.log") or line.strip() or "no output"
        raise DependencyError(f"the crawl's frontier node did not start: {last}")
    return proc, f"127.0.0.1:{m.group(1)}"


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    if not lines:
        return ""
    try:
        return str(json.loads(lines[-1]).get("msg", lines[-1]))
    except ValueError:
        return lines[-1]


def stop_node(node: subprocess.Popen[str]) -> None:
    node.terminate()
    try:
        node.wait(timeout=15)
    except subprocess.TimeoutExpired:
        node.kill()
        node.wait()


# ---------------------------------------------------------------------------------------------- a run


class Run:
    """The state of one run: why it ends, the stop and force events, and what the operator is told."""

    def __init__(self, opts: CrawlOptions, progress: Progress) -> None:
        self.opts = opts
        self.progress = progress
        self.stop = asyncio.Event()
        self.force = asyncio.Event()
        self.reason = ""
        self.signals = 0
        self.next_ready_s = -1.0
        self.t0 = time.monotonic()
        self.worker: Worker | None = None
        self.workers: WorkerProcesses | None = None  # the further worker processes (--workers N)
        self.node: subprocess.Popen[str] | None = None
        self.failed = ""

    def counts(self, worker: Worker, metrics: WorkerMetrics) -> Counts:
        """What every worker of the crawl did: this process's and its children's."""
        own = worker_counts(worker, metrics)
        return own + self.workers.counts() if self.workers is not None else own

    def end(self, reason: str) -> None:
        """End the run for `reason` (drained, budget, duration, stopped, idle); the first reason stays."""
        if not self.reason:
            self.reason = reason
        self.stop.set()

    def on_signal(self) -> None:
        """Ctrl-C or SIGTERM: the first lets fetches in flight finish, the second hands them back now."""
        self.signals += 1
        if self.workers is not None and self.signals <= 2:
            self.workers.stop()  # the same to each child: finish what is in flight, then hand back at once
        in_flight = self.worker.stats.in_flight if self.worker is not None else 0
        if self.signals == 1:
            self.end("stopped")
            if in_flight:
                fetches = "1 fetch" if in_flight == 1 else f"{in_flight} fetches"
                self.progress.note(
                    f"stopping: {fetches} in flight may finish ({self.opts.grace_s:g} s at most); "
                    "press Ctrl-C again to hand them back now"
                )
        elif self.signals == 2:
            self.force.set()
            self.progress.note("stopping now: handing the fetches in flight back to the frontier")
        else:
            os._exit(EXIT_STOPPED)


async def _crawl(opts: CrawlOptions, address: str, run: Run) -> tuple[dict[str, Any], Worker, WorkerMetrics]:
    """Seed the node, run the worker until the crawl ends, and take the report."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, run.on_signal)
    if opts.duration_s is not None:  # a continuous crawl never drains: it ends cleanly after --duration
        loop.call_later(max(0.0, opts.duration_s - (time.monotonic() - run.t0)), run.end, "duration")
    channel = grpc.aio.insecure_channel(address, options=grpc_options())
    stub = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
    try:
        if opts.resume:
            released = await stub.ReleaseLeases(
                pb.ReleaseLeasesRequest(every_worker=True, reason="worker_gone"), timeout=30
            )
            if released.released:
                run.progress.note(f"resume: {released.released} fetch(es) a stopped run held handed back")
        if opts.reconsider:
            done = await stub.Reconsider(pb.ReconsiderRequest(reasons=opts.reconsider), timeout=300)
            run.progress.note(
                f"resume: {done.rescheduled} URL(s) refused by {', '.join(opts.reconsider)} scheduled again "
                "under this run's wider settings"
            )
        if opts.seeds:
            links = [pb.Link(observed=s, seed=True) for s in opts.seeds]
            await stub.Discover(pb.DiscoverRequest(links=links), timeout=30)
        worker, metrics = _worker(opts, address)
        run.worker = worker
        watcher = asyncio.create_task(_watch(stub, worker, metrics, run))
        try:
            if run.workers is not None:  # after the hand-back above, which would take their first leases too
                run.workers.start()
            await worker.run(run.stop, until_drained=True, grace_s=opts.grace_s, force=run.force)
        finally:
            drained = not run.stop.is_set()
            run.stop.set()
            await watcher
            if run.workers is not None:  # drained: each child sees it too and ends; else they are stopped
                if run.failed:
                    run.workers.kill()
                await run.workers.close(_CHILDREN_DRAIN_S if drained else 0.0)
            run.progress.close()
            await worker.close()
        if run.failed:
            raise DependencyError(f"{run.failed}; see {opts.out / 'node.log'}, then --resume")
        run.end("drained")
        stream = stub.ReportStream(pb.ReportRequest(dispositions=True), timeout=300)  # any size, in 1 MiB pieces
        report: dict[str, Any] = json.loads(b"".join([chunk.data async for chunk in stream]))
    except grpc.aio.AioRpcError as e:
        raise DependencyError(
            f"the crawl's frontier node failed ({e.code().name}: {e.details()}); see {opts.out / 'node.log'}"
        ) from None
    finally:
        await channel.close(None)
    if run.reason == "drained" and any(b["rule"] == "pages_total" for b in report.get("suppressed_by_rule", [])):
        run.reason = "budget"
    return report, worker, metrics


def _worker(opts: CrawlOptions, address: str) -> tuple[Worker, WorkerMetrics]:
    limits = body_limits(opts.max_bytes, opts.total_timeout_s)
    fetcher = Fetcher(NetworkPolicy(opts.allow_network), opts.user_agent, limits, max_connections=opts.fetchers)
    metrics = WorkerMetrics()
    if opts.metrics_port is not None:
        serve_metrics(opts.metrics_port, metrics.registry, "127.0.0.1:0")
    worker = Worker(
        StaticRouter(address),
        fetcher,
        warc=WarcWriter(opts.out / "warc"),
        max_in_flight=opts.fetchers,
        product_token=product_token(opts.user_agent),
        worker_id=f"crawl-{os.getpid()}",
        metrics=metrics,
        channel_options=grpc_options(),
    )
    return worker, metrics


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _worker_settings(opts: CrawlOptions, address: str) -> WorkerSettings:
    """What the crawl's worker children run with: the crawl's own fetch settings."""
    return WorkerSettings(
        address=address,
        warc_dir=opts.out / "warc",
        allow_network=tuple(opts.allow_network),
        user_agent=opts.user_agent,
        fetchers=opts.fetchers,
        fetch_timeout_s=opts.total_timeout_s,
        max_bytes=opts.max_bytes,
        grace_s=opts.grace_s,
        log_format=opts.log_format,
        metrics_port=opts.metrics_port + 2 if opts.metrics_port is not None else None,
    )


async def _watch(stub: pb_grpc.FrontierStub, worker: Worker, metrics: WorkerMetrics, run: Run) -> None:
    """Draw the live line twice a second, and end the run when the only work left waits too long (idle)."""
    idle_polls = 0
    threshold = max(run.opts.idle_exit_s, 2 * run.opts.delay)
    # A continuous crawl always waits for its next revisit: it ends at --duration or Ctrl-C, never as idle.
    idle_exit = run.opts.idle_exit_s > 0 and not run.opts.revisit.enabled
    while not run.stop.is_set():
        if run.node is not None and run.node.poll() is not None:
            run.failed = f"the crawl's frontier node stopped unexpectedly (exit code {run.node.returncode})"
            run.end("error")
            run.force.set()  # no node to finish anything with
            return
        if run.workers is not None:
            for i, code in run.workers.ended_early():
                how = f"killed by {_signal_name(-code)}" if code < 0 else f"exit code {code}"
                run.progress.note(
                    f"worker {i} of {run.opts.workers} ended ({how}; see {run.opts.out / 'workers.log'}); "
                    "what it had in flight goes back to the queue when its leases end"
                )
        with contextlib.suppress(grpc.aio.AioRpcError):
            stats: pb.StatsResponse = await stub.Stats(pb.StatsRequest(), timeout=5)
            done = run.counts(worker, metrics)
            run.progress.update(stats, done.fetched, done.errors)
            left = sum(stats.urls_by_state.get(s, 0) for s in _UNFINISHED)
            blocked = stats.in_flight == 0 and worker.stats.in_flight == 0 and left > 0
            if idle_exit and blocked and (stats.next_ready_s < 0 or stats.next_ready_s > threshold):
                idle_polls += 1
                if idle_polls >= 3:
                    run.next_ready_s = stats.next_ready_s
                    run.end("idle")
            else:
                idle_polls = 0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.stop.wait(), 0.5)


# ---------------------------------------------------------------------------------------------- the whole crawl


def run_crawl(opts: CrawlOptions, out: TextIO = sys.stdout) -> int:
    """Run the crawl to its end: 0 (ended, something fetched), 3 (nothing fetched) or 130 (stopped, resumable)."""
    crawl_dir = CrawlDir(opts.out)
    crawl_dir.check(opts.resume)
    made = crawl_dir.create()
    try:
        held = crawl_dir.lock()
    except UsageError:
        if not opts.resume:
            made.undo()
        raise
    try:
        return _run(opts, crawl_dir, made, out)
    finally:
        held.close()


def _run(opts: CrawlOptions, crawl_dir: CrawlDir, made: Made, out: TextIO) -> int:
    before = _settings_before(crawl_dir) if opts.resume else None
    try:
        _write_settings(opts, crawl_dir)
        if opts.resume:
            finalize_open_files(crawl_dir.warc)
        log = open(crawl_dir.node_log, "a", encoding="utf-8")  # noqa: SIM115 - closed below, after the node
        try:
            node, address = start_node_process(opts, log)
        except BaseException:
            log.close()
            raise
    except BaseException:
        if not opts.resume:
            made.undo()
        else:  # a resume that did not start changed nothing: not its settings, nor the history of runs
            _restore_settings(crawl_dir, before)
        raise
    if opts.notice:
        print(f"hostring: {opts.notice}", file=sys.stderr, flush=True)
    progress = Progress(sys.stderr, opts.progress)
    run = Run(opts, progress)
    run.node = node
    workers_log = open(crawl_dir.workers_log, "a", encoding="utf-8") if opts.workers > 1 else None  # noqa: SIM115
    if workers_log is not None:
        run.workers = WorkerProcesses(_worker_settings(opts, address), opts.workers - 1, crawl_dir.workers, workers_log)
    loop = asyncio.new_event_loop()
    try:
        report, worker, metrics = loop.run_until_complete(_crawl(opts, address, run))
    finally:
        loop.close()
        stop_node(node)
        log.close()
        if workers_log is not None:
            workers_log.close()
    done = run.counts(worker, metrics)
    finish = Finish(
        reason=run.reason,
        elapsed_s=time.monotonic() - run.t0,
        requests=done.requests,
        bytes=done.bytes,
        idle_exit_s=opts.idle_exit_s,
        out=str(opts.out),
    )
    if run.reason == "idle":
        finish.deferred = _deferred(report, run.next_ready_s)
    code = EXIT_STOPPED if run.reason == "stopped" else EXIT_OK
    if code == EXIT_OK and not report["by_state"].get("fetched"):
        code = EXIT_NOTHING_FETCHED
    report["finish"] = {**finish.to_dict(), "exit_code": code}
    crawl_dir.report.write_text(json.dumps(report, indent=2, sort_keys=True), encoding="utf-8")
    print(summarize(escape_tree(report), finish), file=out)  # what crawled servers chose, escaped
    print(f"report: {crawl_dir.report}   WARC: {crawl_dir.warc}", file=out)
    if run.reason == "stopped":
        print(f"stopped; continue with: hostring crawl --resume --out {opts.out}", file=out)
    return code


def _deferred(report: dict[str, Any], next_ready_s: float) -> list[dict[str, Any]]:
    """The unfinished URLs of an idle end, each with the earliest time it may go on."""
    soonest = time.time() + next_ready_s if next_ready_s > 0 else 0.0
    out = []
    for u in report["unresolved"]["items"]:
        if u["state"] in _UNFINISHED:
            row = dict(u)
            row["not_before"] = max(float(u.get("not_before") or 0.0), soonest)
            out.append(row)
    return out


def _settings_before(crawl_dir: CrawlDir) -> bytes | None:
    """OUT/crawl.toml as it is before a resume writes it (None: there is none)."""
    try:
        return crawl_dir.settings.read_bytes()
    except OSError:
        return None


def _restore_settings(crawl_dir: CrawlDir, before: bytes | None) -> None:
    with contextlib.suppress(OSError):
        if before is None:
            crawl_dir.settings.unlink(missing_ok=True)
        else:
            crawl_dir.settings.write_bytes(before)


def _write_settings(opts: CrawlOptions, crawl_dir: CrawlDir) -> None:
    """OUT/crawl.toml: the settings the crawl runs with, its seeds and the history of its runs."""
    values = opts.settings or settings_of(opts)
    seeds = list(dict.fromkeys([*_stored_seeds(crawl_dir), *opts.seeds]))
    runs = opts.runs or [*_stored_runs(crawl_dir), run_record("resume" if opts.resume else "start", [])]
    lines = [
        "# The settings of this crawl, written when it started and updated by every --resume that changed one.",
        "# `hostring crawl --resume --out DIR` runs with them; a flag, HOSTRING_* variable or --config file given",
        "# on resume overrides them (and is recorded here). This file is a valid --config file as well.",
        "",
        *(f"{key} = {toml_value(value)}" for key, value in sorted(values.items()) if value is not None),
        "",
        "# The start URLs given so far (not sent again on resume: the crawl's store holds them).",
        f"seeds = {toml_value(seeds)}",
    ]
    for entry in runs:
        lines += ["", "[[runs]]", *(f"{k} = {toml_value(v)}" for k, v in entry.items())]
    tmp = crawl_dir.settings.with_name(crawl_dir.settings.name + ".tmp")
    try:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.replace(tmp, crawl_dir.settings)
    except OSError as e:
        raise UsageError(f"--out {opts.out}: cannot write {crawl_dir.settings.name} ({e.strerror})") from e


def _stored(crawl_dir: CrawlDir) -> dict[str, Any]:
    import tomllib

    try:
        with crawl_dir.settings.open("rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _stored_seeds(crawl_dir: CrawlDir) -> list[str]:
    return [str(s) for s in _stored(crawl_dir).get("seeds", [])]


def _stored_runs(crawl_dir: CrawlDir) -> list[dict[str, Any]]:
    return [dict(r) for r in _stored(crawl_dir).get("runs", []) if isinstance(r, dict)]


def settings_of(opts: CrawlOptions) -> dict[str, Any]:
    """The crawl's settings under their flag names, for CrawlOptions built without the command line (demo)."""
    scope = str(opts.scope_file) if opts.scope_file is not None else opts.scope
    return {
        "scope": scope,
        "allow-network": list(opts.allow_network),
        "delay": opts.delay,
        "concurrency": opts.concurrency,
        "max-pages": opts.max_pages,
        "max-depth": opts.max_depth,
        "max-pages-per-host": opts.max_pages_per_host,
        "user-agent": opts.user_agent or None,
        "fetchers": opts.fetchers,
        "workers": opts.workers,
        "lease-s": opts.lease_s,
        "fetch-timeout": opts.total_timeout_s,
        "max-response-bytes": opts.max_bytes,
        "metrics-port": opts.metrics_port,
        "idle-exit": opts.idle_exit_s,
        "grace": opts.grace_s,
        **revisit_settings(opts.revisit),
        "duration": opts.duration_s,
    }
