"""Figures of one frontier node: Discover and Lease+Complete throughput, through gRPC and in process, and RAM.

`python -m bench.node [--json] [--quick] [--rounds N] [--py-spy DIR]` prints, with the machine and the workload stated:

1. Discover links/s through gRPC with the journal on: a `hostring node` subprocess on a SQLite store in a temp
   dir (`--delay 0`), the client in this process sending pre-serialized batches of 256 links over 10k hosts,
   two thirds of them duplicates, half of those spelled differently (upper-case scheme and host, `:80`,
   `utm_source`, a fragment) so dedup has to happen on the normalized fetch key.
2. Lease+Complete URLs/s through gRPC with 10k ready hosts: robots items first (leased, completed 404, not
   timed), then Lease(max_items=256) and one CompleteBatch per lease, as a busy worker coalesces them; and, on a
   fresh node, each CompleteBatch asking for the next lease in its reply, as a fetch worker's completions do.
3. The same two figures for the core in process (Frontier on SqliteStore, flushing after every call as the
   gRPC shell does; and Frontier on MemoryStore), no gRPC; and Lease+Complete with one commit per Lease batch
   of completions, the ceiling a batched Complete RPC would lift the gRPC figure towards.
4. The issue's workload on a fresh node: 600k links over 2,000 hosts (200k distinct, two thirds duplicates)
   through Discover, then drained with Lease + CompleteBatch, one in flight per host, until the node is drained.
5. gRPC alone (bench/grpc_floor.py): the same Discover requests answered by a server that decodes each one and
   sends a prebuilt reply of the node's shape: the ceiling the transport sets, which the node's figure is read
   against.
6. RAM bytes per admitted URL at 1M URLs (100k with --quick): a fresh subprocess admits them over 10k hosts
   through `Frontier.discover` on SqliteStore; VmRSS after minus before, after gc, over the URLs admitted.
   Also the seen-set's bytes per URL.

Every rate is also given per CPU-second of the process doing the work (the node for gRPC figures), which
stays comparable when the machine is shared. `--py-spy DIR` samples the node during the gRPC phases and prints
where its Python time goes. No pass/fail: the issue's targets are printed beside the figures for context only.
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import json
import os
import platform
import random
import re
import select
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import grpc

from bench import grpc_floor
from bench.reference import reference_loop_busy_ns, reference_loop_ns
from frontier_node.core.config import FrontierConfig, PolitenessConfig, RevisitConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.ports import Store
from frontier_node.core.records import Kind, Link, Outcome, Verdict
from frontier_node.store.memory import MemoryStore
from frontier_node.store.sqlite import SqliteStore
from hostring import native
from hostring.clock import WallClock
from hostring.limits import grpc_options
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from hostring_cli.args import positive_int
from hostring_testing.proc import stop_process

REPO = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S = 30.0
RPC_TIMEOUT_S = 120.0
_PORT_LINE = re.compile(r"listening on port (\d+)")
_DISCOVER_METHOD = "/hostring.v1.Frontier/Discover"

# The targets (2-core machine, client in another process), shown beside the figures for context.
TARGETS: dict[str, str] = {
    "discover_links_per_s_grpc": ">= 60,000",
    "lease_complete_urls_per_s_grpc": ">= 20,000",
    "lease_complete_reply_urls_per_s_grpc": ">= 20,000",
    "ram_bytes_per_url": "< 150",
    "seen_bytes_per_url": "< 16",
    "peer_discover_links_per_s": ">= 60,000",
    "peer_drain_urls_per_s": ">= 20,000",
}


@dataclass(frozen=True)
class Workload:
    """What is measured; printed with the figures so that they can be compared."""

    hosts: int = 10_000
    links: int = 300_000
    batch: int = 256
    lease_batch: int = 256
    lease_pages: int = 60_000
    grpc_streams: int = 2
    ram_urls: int = 1_000_000
    ram_hosts: int = 10_000
    ram_batch: int = 1_000
    seed: int = 1
    revisit: str = "off"  # the node's --revisit policy (default interval): revisits scheduled, none due in the run

    @property
    def unique(self) -> int:
        """Distinct fetch keys in the link stream: every third link is new."""
        return (self.links + 2) // 3

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            unique_urls=self.unique,
            duplicates=self.links - self.unique,
            duplicate_spellings="half of the duplicates respelled: HTTP://SITE.COM, :80, ?utm_source=bench, "
            "#fragment; the rest exact repeats of an earlier link, picked uniformly",
            url_shape="http://site{u % hosts}.com/p/{u}",
            node="hostring node subprocess, SQLite store in a temp dir (WAL, commit before every answer), "
            "--delay 0, one Python process; client in this process",
            discover_client=f"{self.grpc_streams} client threads, each one Discover in flight, requests "
            "serialized before the clock starts",
            lease_reply_client=f"the same pages on a fresh node (the same links admitted, robots settled, untimed); "
            f"each of {self.grpc_streams} client threads takes one Lease(max_items={self.lease_batch}), then sends "
            f"each lease's CompleteBatch with lease_max_items={self.lease_batch}: its reply carries the next lease, "
            "as a fetch worker's completions ask for theirs (one call and one commit per batch)",
            grpc_floor="bench/grpc_floor.py: a grpc.aio server that decodes each of the same Discover requests and "
            "answers a reply of the node's shape built beforehand (the transport's ceiling); same client",
            lease_client=f"{self.grpc_streams} client threads, each Lease(max_items={self.lease_batch}) then one "
            "CompleteBatch with every item of the lease (as a busy worker coalesces them); outcome 200 with a "
            "unique body digest and simhash, no links; robots items completed 404 before the clock starts",
            core="Frontier in this process, WallClock; SqliteStore flushed after every discover/lease/complete "
            "call (as the gRPC shell does); MemoryStore is the reference backend (copies each row)",
            revisit=f"--revisit {self.revisit}: "
            + (
                "one-shot"
                if self.revisit == "off"
                else "every completed page "
                "gets a due time a day away (scheduled and journaled, none due during the run)"
            ),
            ram="fresh subprocess, Frontier on SqliteStore, discover() in batches of ram_batch unique URLs over "
            "ram_hosts hosts, flush per batch; VmRSS after minus before, gc.collect() before both reads",
        )
        return d


QUICK = Workload(hosts=1_000, links=15_000, lease_pages=3_000, ram_urls=100_000)


@dataclass(frozen=True)
class PeerWorkload:
    """The issue's comparison workload: one stream of links admitted, then the whole frontier drained."""

    hosts: int = 2_000
    links: int = 600_000
    batch: int = 256
    lease_batch: int = 256
    streams: int = 2
    seed: int = 2

    @property
    def unique(self) -> int:
        return (self.links + 2) // 3

    def describe(self) -> str:
        return (
            f"{self.links:,} links over {self.hosts:,} hosts ({self.unique:,} distinct, two thirds duplicates, half "
            f"of those respelled), Discover in batches of {self.batch} on {self.streams} threads; then drained on "
            f"{self.streams} threads, each Lease(max_items={self.lease_batch}, wait_ms=50) + one CompleteBatch of "
            "the lease, one in flight per host (--delay 0), robots.txt 404 included, until the node says drained"
        )


QUICK_PEER = PeerWorkload(hosts=50, links=3_000)


# ====================================================================== machine and workload

SPEED_DRIFT = 0.15
"""The reference loop moving more than this between a run's start and end is pointed out beside the figures."""


def machine_line(m: dict[str, Any], *, sqlite: bool) -> str:
    """The machine as one line of a bench's table (`machine()`'s figures, the SQLite version when it matters)."""
    load = ", ".join(f"{x:.1f}" for x in m["loadavg_start"])
    end = f", {m['loadavg_end'][0]:.1f} at the end" if "loadavg_end" in m else ""
    loop_end = ""
    if "reference_loop_ns_end" in m:
        drift = m["reference_loop_ns_end"] / m["reference_loop_ns"] - 1
        loop_end = f" at the start, {m['reference_loop_ns_end']} at the end" + (
            f" (the loop's time changed by {drift:+.0%} during the run: the machine's speed changed, and these figures "
            "compare with other runs' only roughly)"
            if abs(drift) > SPEED_DRIFT
            else ""
        )
    return (
        f"machine: {m['cores']} cores ({m['cores_usable']} usable), {m['cpu_model']}, "
        f"{m['ram_bytes'] / 2**30:.1f} GiB, {m['python_implementation']} {m['python']}, grpcio {m['grpcio']}, "
        + (f"SQLite {m['sqlite']}, " if sqlite else "")
        + f"{m['platform']}; load average {load} at the start{end}; reference loop {m['reference_loop_ns']} "
        f"ns/step{loop_end} (CPU; rates scale with its inverse across machines), {m['reference_loop_busy_ns']} on "
        f"each CPU when all are busy at once (CPU per unit of work grows as processes overlap); core {m['core_build']}"
    )


def end_of_run(m: dict[str, Any]) -> None:
    """Add the load average and the reference loop at the end of a run to `machine()`'s figures `m`: a VM's
    speed can change by 2x within minutes when its host is busy, and the two readings of the loop show it."""
    m["loadavg_end"] = list(os.getloadavg())
    m["reference_loop_ns_end"] = reference_loop_ns()


def machine() -> dict[str, Any]:
    """Cores, CPU model, RAM, Python and library versions of this machine."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    mem = _proc_status(Path("/proc/meminfo")).get("MemTotal", 0)
    return {
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": model,
        "ram_bytes": mem,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "grpcio": grpc.__version__,
        "sqlite": sqlite3.sqlite_version,
        "loadavg_start": list(os.getloadavg()),
        "reference_loop_ns": reference_loop_ns(),
        "reference_loop_busy_ns": reference_loop_busy_ns(),
        "core_build": core_build(),
    }


def core_build() -> str:
    """Whether the node's hot modules run compiled (scripts/native.py build) or from their sources."""
    compiled = native.built()
    if not compiled:
        return "from source (scripts/native.py build compiles it)"
    return f"compiled with mypyc ({len(compiled)} of {len(native.MODULES)} modules)"


def _proc_status(path: Path) -> dict[str, int]:
    """The `Name: N kB` lines of a /proc status-like file, in bytes."""
    out: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            name, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[name] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process (all its threads): this one, or `pid` from /proc."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    return _stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def _stat_cpu_seconds(stat: Path) -> float:
    """utime + stime of a /proc stat file (a process's or one thread's), in seconds."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of process `pid` by its OS name (hostring names its threads: core, node-loop, ...;
    threads of one name are summed)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            cpu = _stat_cpu_seconds(task / "stat")
            name = (task / "comm").read_text().strip()
            out[name] = out.get(name, 0.0) + cpu
        except OSError:
            continue  # the thread ended meanwhile
    return out


class Stopwatch:
    """Wall seconds and CPU seconds of this process (and of a node process, if given) over a `with` block.

    CPU seconds make a figure comparable on a machine shared with other work: count / CPU-s is the rate the
    process would reach with a core of its own, give or take cache effects. For a node, also its CPU seconds by
    thread (`node_threads`): its threads share one GIL, so which of them spends the CPU is where its time goes.
    """

    def __init__(self, node_pid: int | None = None) -> None:
        self.node_pid = node_pid
        self.wall = self.cpu = self.node_cpu = 0.0
        self.node_threads: dict[str, float] = {}

    def __enter__(self) -> Stopwatch:
        self._t = time.perf_counter()
        self._c = cpu_seconds()
        self._n = cpu_seconds(self.node_pid) if self.node_pid else 0.0
        self._threads = thread_cpu_seconds(self.node_pid) if self.node_pid else {}
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._t
        self.cpu = cpu_seconds() - self._c
        if self.node_pid:
            self.node_cpu = cpu_seconds(self.node_pid) - self._n
            after = thread_cpu_seconds(self.node_pid)
            self.node_threads = {name: cpu - self._threads.get(name, 0.0) for name, cpu in after.items()}


def unique_url(u: int, hosts: int) -> str:
    """The canonical spelling of the u-th distinct URL; hosts are filled round robin."""
    return f"http://site{u % hosts}.com/p/{u}"


def _respelled(u: int, hosts: int, style: int) -> str:
    """Another spelling of the u-th URL with the same fetch key (styles 0-3), or the same spelling (4+)."""
    h = u % hosts
    if style == 0:
        return f"HTTP://SITE{h}.COM/p/{u}"
    if style == 1:
        return f"http://site{h}.com:80/p/{u}"
    if style == 2:
        return f"http://site{h}.com/p/{u}?utm_source=bench"
    if style == 3:
        return f"http://site{h}.com/p/{u}#section-2"
    return unique_url(u, hosts)


def link_stream(w: Workload) -> list[str]:
    """The Discover workload: every third link new, the others earlier links, half of them respelled."""
    rng = random.Random(w.seed)
    out: list[str] = []
    unique = 0
    for i in range(w.links):
        if i % 3 == 0:
            out.append(unique_url(unique, w.hosts))
            unique += 1
        else:
            out.append(_respelled(rng.randrange(unique), w.hosts, rng.randrange(8)))
    return out


def batches(items: Sequence[str], size: int) -> list[Sequence[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def node_config(revisit: str = "off") -> FrontierConfig:
    """The core's configuration matching `hostring node --delay 0 --revisit POLICY` (CLI defaults otherwise)."""
    return FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0), revisit=RevisitConfig(revisit, 86_400.0,
                          8_640.0, 864_000.0))  # fmt: skip


def page_outcome(n: int, status: int = 200) -> Outcome:
    """A successful page fetch with a body digest and simhash of its own (so bodies are indexed, not deduped)."""
    return Outcome(
        status=status,
        content_type="text/html",
        bytes=20_000,
        response_s=0.0,
        body_digest=f"sha256:{n:064x}",
        simhash=(n * 0x9E3779B97F4A7C15) & (2**64 - 1) or 1,
    )


ROBOTS_404 = Outcome(status=404)


# ====================================================================== the node subprocess


class NodeProcess:
    """A `hostring node` subprocess on a SQLite store; stderr goes to a file quoted when something fails."""

    def __init__(self, store: Path, log: Path, revisit: str = "off") -> None:
        self._log: IO[bytes] = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.log_path = log
        cmd = [
            sys.executable, "-m", "hostring_cli", "--log-level", "WARNING", "node", "--store", f"sqlite:///{store}",
            "--listen", "127.0.0.1:0", "--delay", "0", "--revisit", revisit,
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=self._log)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], STARTUP_TIMEOUT_S)
        line = self.proc.stdout.readline().decode() if ready else ""
        m = _PORT_LINE.search(line)
        if m is None:
            self.stop()
            raise RuntimeError(f"node did not start (stdout {line!r}):\n{log.read_text()[-2000:]}")
        self.port = int(m.group(1))
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}", options=grpc_options())
        grpc.channel_ready_future(self.channel).result(timeout=STARTUP_TIMEOUT_S)
        self.stub = pb_grpc.FrontierStub(self.channel)  # type: ignore[no-untyped-call]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not go within 10 s; close the channel and files."""
        if hasattr(self, "channel"):
            self.channel.close()
        stop_process(self.proc)
        self._log.close()


@contextmanager
def py_spy(pid: int, out: Path | None) -> Iterator[None]:
    """Sample `pid` with `py-spy record --format raw --gil` while the block runs (nothing when `out` is None).

    `--gil` samples only the thread holding the GIL: where the node's Python CPU goes. Without it, threads blocked
    in C (lock waits, the gRPC poller) show up as busy and drown the picture.
    """
    if out is None:
        yield
        return
    spy = subprocess.Popen(
        ["py-spy", "record", "--pid", str(pid), "--format", "raw", "--rate", "200", "--nonblocking", "--gil", "-o",
         str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(0.5)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()


def profile_summary(path: Path, top: int = 15) -> dict[str, list[tuple[str, float]]]:
    """Self and inclusive shares (percent of samples) of the functions in a py-spy raw profile, line numbers merged."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    if not total:
        return {"self": [], "inclusive": []}
    return {
        "self": [(f, round(100.0 * n / total, 1)) for f, n in own.most_common(top)],
        "inclusive": [(f, round(100.0 * n / total, 1)) for f, n in inclusive.most_common(top * 2)],
    }


# ====================================================================== through gRPC


def _run_threads(n: int, target: Callable[[int], None]) -> None:
    """Run target(0..n-1) on n threads and re-raise the first error any of them hit."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(i,), name=f"bench-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def discover_payloads(urls: list[str], batch: int) -> list[bytes]:
    """Discover requests of `batch` links each, serialized (before any clock starts)."""
    return [
        pb.DiscoverRequest(links=[pb.Link(observed=u) for u in b], worker_id="bench").SerializeToString()
        for b in batches(urls, batch)
    ]


def _per_unit_us(seconds: dict[str, float], units: int) -> dict[str, float]:
    """CPU microseconds per unit of work of each thread, largest first (threads that spent almost none left out)."""
    ranked = sorted(seconds.items(), key=lambda kv: -kv[1]) if units else []
    return {name: 1e6 * cpu / units for name, cpu in ranked if 1e6 * cpu / units >= 0.05}


def discover_through(
    channel: grpc.Channel, server_pid: int, payloads: Sequence[bytes], links: int, streams: int
) -> dict[str, Any]:
    """Send every payload (a serialized DiscoverRequest; `links` in all) to Discover on `channel` from `streams`
    threads, one call in flight each; rates over the whole stream and the server process's CPU."""
    call = channel.unary_unary(
        _DISCOVER_METHOD, request_serializer=None, response_deserializer=pb.DiscoverResponse.FromString
    )
    counter = itertools.count()
    tallies: list[Counter[int]] = [Counter() for _ in range(streams)]

    def stream(i: int) -> None:
        tally = tallies[i]
        while (n := next(counter)) < len(payloads):
            resp = call(payloads[n], timeout=RPC_TIMEOUT_S)
            tally.update(v.verdict for v in resp.verdicts)

    with Stopwatch(server_pid) as sw:
        _run_threads(streams, stream)
    total: Counter[int] = sum(tallies, Counter())
    return {
        "seconds": sw.wall,
        "links_per_s": links / sw.wall,
        "links_per_node_cpu_s": links / sw.node_cpu,
        "node_cpu_us_per_call": 1e6 * sw.node_cpu / len(payloads),
        "node_cores_busy": sw.node_cpu / sw.wall,
        "client_cores_busy": sw.cpu / sw.wall,
        "node_thread_us_per_link": _per_unit_us(sw.node_threads, links),
        "admitted": total[pb.ADMITTED],
        "duplicate": total[pb.DUPLICATE],
        "other": sum(total.values()) - total[pb.ADMITTED] - total[pb.DUPLICATE],
    }


def complete_request(item: pb.LeaseItem, n: int, worker_id: str) -> pb.CompleteRequest:
    """The completion of a leased item, sent as `worker_id`: the worker that leased it (only the holder settles)."""
    if item.kind == pb.ROBOTS:
        outcome = pb.Outcome(status=404, retry_after_s=-1)
    else:
        o = page_outcome(n)
        outcome = pb.Outcome(
            status=o.status,
            retry_after_s=-1,
            content_type=o.content_type,
            bytes=o.bytes,
            body_digest=o.body_digest,
            simhash=o.simhash,
        )
    return pb.CompleteRequest(lease_id=item.lease_id, generation=item.generation, outcome=outcome, worker_id=worker_id)


def grpc_robots_first(node: NodeProcess, hosts: int, w: Workload, seq: Iterator[int]) -> tuple[int, int]:
    """The untimed phase before Lease+Complete: lease and complete until every host's robots.txt is settled (404),
    so that the timed phase leases pages only; (robots completed, pages completed on the way). `seq` numbers the
    page outcomes (each a unique body), shared with the timed phase."""
    stub = node.stub
    robots_done = pages_before = 0
    while robots_done < hosts:
        items = stub.Lease(pb.LeaseRequest(worker_id="bench", max_items=w.lease_batch), timeout=RPC_TIMEOUT_S).items
        if not items:
            break
        futures = [
            stub.Complete.future(complete_request(it, next(seq), "bench"), timeout=RPC_TIMEOUT_S) for it in items
        ]
        for it, f in zip(items, futures, strict=True):
            if not f.result().accepted:
                raise RuntimeError(f"Complete of {it.fetch_key} refused")
            robots_done += it.kind == pb.ROBOTS
            pages_before += it.kind == pb.PAGE
    return robots_done, pages_before


def worker_batches(
    stub: pb_grpc.FrontierStub,
    worker: str,
    lease_batch: int,
    more: Callable[[], bool],
    build: Callable[[pb.LeaseItem], pb.CompleteRequest],
    *,
    in_reply: bool,
) -> Iterator[tuple[Sequence[pb.LeaseItem], pb.CompleteBatchResponse]]:
    """One stream playing a fetch worker: Lease(lease_batch) while `more()`, then one CompleteBatch of each lease's
    items (`build` makes each completion); with `in_reply` each CompleteBatch asks for the next lease, which its
    reply carries, as long as `more()`. Yields (items, reply) per batch; ends when no lease comes."""
    items: Sequence[pb.LeaseItem] = ()
    while True:
        going = more()
        if not items:
            if not going:
                return
            items = stub.Lease(pb.LeaseRequest(worker_id=worker, max_items=lease_batch), timeout=RPC_TIMEOUT_S).items
            if not items:
                return
        batch = pb.CompleteBatchRequest(
            completions=[build(it) for it in items],
            worker_id=worker,
            lease_max_items=lease_batch if in_reply and going else 0,
        )
        resp = stub.CompleteBatch(batch, timeout=RPC_TIMEOUT_S)
        yield items, resp
        items = resp.leases


def next_request(item: pb.LeaseItem, seq: Iterator[int], worker: str) -> pb.CompleteRequest:
    """complete_request of `item` with the next number of `seq` (each page a body of its own)."""
    return complete_request(item, next(seq), worker)


def grpc_lease_complete(
    node: NodeProcess, w: Workload, seq: Iterator[int], before: tuple[int, int], *, in_reply: bool = False
) -> dict[str, Any]:
    """Lease(max_items) + one CompleteBatch of the lease on each stream until `lease_pages` pages are done (after
    `grpc_robots_first`, whose counts are `before`). With `in_reply`, each CompleteBatch asks for the next lease
    (lease_max_items) and its reply carries it, as a fetch worker's completions do: after a stream's first Lease,
    one call and one commit per batch instead of two."""
    stub = node.stub
    robots_done, pages_before = before
    ready = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S).hosts_ready

    lock = threading.Lock()
    done = [0]

    def more() -> bool:
        with lock:
            return done[0] < w.lease_pages

    def stream(i: int) -> None:
        worker = f"bench-{i}"
        build = functools.partial(next_request, seq=seq, worker=worker)
        for items, resp in worker_batches(stub, worker, w.lease_batch, more, build, in_reply=in_reply):
            for it, r in zip(items, resp.results, strict=True):
                if not r.accepted:
                    raise RuntimeError(f"Complete of {it.fetch_key} refused")
            with lock:
                done[0] += len(items)

    with Stopwatch(node.proc.pid) as sw:
        _run_threads(w.grpc_streams, stream)
    return {
        "seconds": sw.wall,
        "urls": done[0],
        "urls_per_s": done[0] / sw.wall,
        "urls_per_node_cpu_s": done[0] / sw.node_cpu,
        "node_cores_busy": sw.node_cpu / sw.wall,
        "client_cores_busy": sw.cpu / sw.wall,
        "node_thread_us_per_url": _per_unit_us(sw.node_threads, done[0]),
        "hosts_ready_at_start": ready,
        "robots_completed_untimed": robots_done,
        "pages_completed_untimed": pages_before,
    }


def grpc_drain(node: NodeProcess, pw: PeerWorkload) -> dict[str, Any]:
    """Lease + CompleteBatch on `streams` threads until the node reports itself drained; pages/s over the drain."""
    stub = node.stub
    seq = itertools.count(1)
    lock = threading.Lock()
    tally = Counter[int]()

    def stream(i: int) -> None:
        request = pb.LeaseRequest(worker_id=f"peer-{i}", max_items=pw.lease_batch, wait_ms=50)
        while True:
            resp = stub.Lease(request, timeout=RPC_TIMEOUT_S)
            if not resp.items:
                if resp.drained:
                    return
                continue
            completions = [complete_request(it, next(seq), request.worker_id) for it in resp.items]
            batch = pb.CompleteBatchRequest(completions=completions)
            results = stub.CompleteBatch(batch, timeout=RPC_TIMEOUT_S).results
            for it, r in zip(resp.items, results, strict=True):
                if not r.accepted:
                    raise RuntimeError(f"Complete of {it.fetch_key} refused")
            with lock:
                tally.update(it.kind for it in resp.items)

    with Stopwatch(node.proc.pid) as sw:
        _run_threads(pw.streams, stream)
    pages = tally[pb.PAGE]
    return {
        "seconds": sw.wall,
        "pages": pages,
        "robots": tally[pb.ROBOTS],
        "urls_per_s": pages / sw.wall,
        "urls_per_node_cpu_s": pages / sw.node_cpu,
        "node_cores_busy": sw.node_cpu / sw.wall,
    }


def peer_figures(pw: PeerWorkload, tmp: Path) -> dict[str, Any]:
    """The issue's workload on a fresh node: admission through Discover, then a full drain."""
    urls = link_stream(Workload(hosts=pw.hosts, links=pw.links, batch=pw.batch, grpc_streams=pw.streams, seed=pw.seed))
    node = NodeProcess(tmp / "peer.sqlite3", tmp / "peer.log")
    try:
        payloads = discover_payloads(urls, pw.batch)
        disc = discover_through(node.channel, node.proc.pid, payloads, len(urls), pw.streams)
        drain = grpc_drain(node, pw)
    finally:
        node.stop()
    return {"discover": disc, "drain": drain}


# ====================================================================== in process


def core_discover(store: Store, urls: list[str], w: Workload) -> tuple[Frontier, dict[str, Any]]:
    """The same stream through Frontier.discover in process, flushing after every batch as the shell does."""
    frontier = Frontier(store, WallClock(), node_config(w.revisit))
    link_batches = [[Link(u) for u in b] for b in batches(urls, w.batch)]
    tally: Counter[Verdict] = Counter()
    with Stopwatch() as sw:
        for b in link_batches:
            tally.update(v.verdict for v in frontier.discover(b))
            store.flush()
    return frontier, {
        "seconds": sw.wall,
        "links_per_s": len(urls) / sw.wall,
        "links_per_cpu_s": len(urls) / sw.cpu,
        "admitted": tally[Verdict.ADMITTED],
        "duplicate": tally[Verdict.DUPLICATE],
    }


def core_lease_complete(frontier: Frontier, hosts: int, w: Workload, *, flush_each: bool = True) -> dict[str, Any]:
    """Robots first (untimed), then lease + complete each item.

    With `flush_each` the store commits after every call, as the gRPC shell does; without, once per Lease batch
    of completions, which is what a batched Complete RPC would allow.
    """
    store = frontier.store
    n = robots_done = 0
    while robots_done < hosts:
        items = frontier.lease("bench", w.lease_batch)
        store.flush()
        if not items:
            break
        for it in items:
            n += 1
            frontier.complete(it.key, it.generation, ROBOTS_404 if it.kind is Kind.ROBOTS else page_outcome(n))
            store.flush()
            robots_done += it.kind is Kind.ROBOTS
    done = 0
    with Stopwatch() as sw:
        while done < w.lease_pages:
            items = frontier.lease("bench", w.lease_batch)
            store.flush()
            if not items:
                break
            for it in items:
                n += 1
                if not frontier.complete(it.key, it.generation, page_outcome(n)).accepted:
                    raise RuntimeError(f"complete of {it.key} refused")
                if flush_each:
                    store.flush()
            store.flush()
            done += len(items)
    return {"seconds": sw.wall, "urls": done, "urls_per_s": done / sw.wall, "urls_per_cpu_s": done / sw.cpu}


# ====================================================================== RAM


def ram_child(urls: int, hosts: int, batch: int) -> dict[str, Any]:
    """In this (fresh) process: admit `urls` distinct URLs over `hosts` hosts and measure the RSS they cost."""
    status = Path("/proc/self/status")
    with tempfile.TemporaryDirectory(prefix="hostring-bench-ram-") as tmp:
        gc.collect()
        before = _proc_status(status)
        store = SqliteStore(Path(tmp) / "ram.sqlite3")
        frontier = Frontier(store, WallClock(), node_config())
        with Stopwatch() as sw:
            for start in range(0, urls, batch):
                frontier.discover([Link(unique_url(u, hosts)) for u in range(start, min(urls, start + batch))])
                store.flush()
        gc.collect()
        after = _proc_status(status)
        stats = frontier.stats()
        admitted = stats.verdicts.get(("admitted", ""), 0)
        result = {
            "urls": urls,
            "hosts": hosts,
            "admitted": admitted,
            "seconds": sw.wall,
            "admit_per_s": admitted / sw.wall,
            "admit_per_cpu_s": admitted / sw.cpu,
            "rss_before": before.get("VmRSS", 0),
            "rss_after": after.get("VmRSS", 0),
            "ram_bytes_per_url": (after.get("VmRSS", 0) - before.get("VmRSS", 0)) / admitted,
            "anon_bytes_per_url": (after.get("RssAnon", 0) - before.get("RssAnon", 0)) / admitted,
            "file_bytes_per_url": (after.get("RssFile", 0) - before.get("RssFile", 0)) / admitted,
            "seen_bytes_per_url": stats.seen_bytes / stats.seen,
            "seen_keys": stats.seen,
            "items_in_ram": stats.queued_in_ram,
            "db_bytes": sum(p.stat().st_size for p in Path(tmp).iterdir()),
        }
        store.close()
    return result


def ram_figures(w: Workload) -> dict[str, Any]:
    """Run ram_child in a fresh interpreter, so nothing measured before pollutes its RSS."""
    cmd = [sys.executable, "-m", "bench.node", "--ram-child", str(w.ram_urls), "--ram-hosts", str(w.ram_hosts),
           "--ram-batch", str(w.ram_batch)]  # fmt: skip
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"RAM measurement failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


# ====================================================================== driver


def run(w: Workload, pw: PeerWorkload, profile_dir: Path | None = None) -> dict[str, Any]:
    """Every figure, in one dict (the --json output)."""
    urls = link_stream(w)
    hosts = min(w.hosts, w.unique)
    figures: dict[str, Any] = {"machine": machine(), "workload": w.describe()}
    payloads = discover_payloads(urls, w.batch)  # the same requests to the node, the fresh node and the gRPC floor

    with tempfile.TemporaryDirectory(prefix="hostring-bench-") as tmp:
        node = NodeProcess(Path(tmp) / "node.sqlite3", Path(tmp) / "node.log", w.revisit)
        try:
            with py_spy(node.proc.pid, profile_dir / "discover.txt" if profile_dir else None):
                disc = discover_through(node.channel, node.proc.pid, payloads, len(urls), w.grpc_streams)
            seq = itertools.count(1)
            before = grpc_robots_first(node, hosts, w, seq)
            with py_spy(node.proc.pid, profile_dir / "lease_complete.txt" if profile_dir else None):
                lc = grpc_lease_complete(node, w, seq, before)
        finally:
            node.stop()
        node = NodeProcess(Path(tmp) / "node-reply.sqlite3", Path(tmp) / "node-reply.log", w.revisit)
        try:
            # the same links on a fresh node, untimed this time
            discover_through(node.channel, node.proc.pid, payloads, len(urls), w.grpc_streams)
            before = grpc_robots_first(node, hosts, w, seq)
            lc_reply = grpc_lease_complete(node, w, seq, before, in_reply=True)
        finally:
            node.stop()
        core: dict[str, dict[str, Any]] = {}
        for name, store in (("sqlite", SqliteStore(Path(tmp) / "core.sqlite3")), ("memory", MemoryStore())):
            frontier, core[f"discover_{name}"] = core_discover(store, urls, w)
            core[f"lease_complete_{name}"] = core_lease_complete(frontier, hosts, w)
            store.close()
            del frontier
        batched_store = SqliteStore(Path(tmp) / "core-batched.sqlite3")
        frontier, _ = core_discover(batched_store, urls, w)
        core["lease_complete_sqlite_batched"] = core_lease_complete(frontier, hosts, w, flush_each=False)
        batched_store.close()
        del frontier
        peer = peer_figures(pw, Path(tmp))
    with grpc_floor.serving(w.batch) as (channel, server_pid):
        transport = discover_through(channel, server_pid, payloads, len(urls), w.grpc_streams)
    gc.collect()
    ram = ram_figures(w)

    figures.update(
        discover_links_per_s_grpc=disc["links_per_s"],
        discover_links_per_node_cpu_s_grpc=disc["links_per_node_cpu_s"],
        discover_admitted_urls_grpc=disc["admitted"],
        discover_duplicates_grpc=disc["duplicate"],
        discover_node_cores_busy=disc["node_cores_busy"],
        discover_node_thread_us_per_link=disc["node_thread_us_per_link"],
        lease_complete_node_thread_us_per_url=lc["node_thread_us_per_url"],
        grpc_floor_links_per_s=transport["links_per_s"],
        grpc_floor_links_per_server_cpu_s=transport["links_per_node_cpu_s"],
        grpc_floor_server_cpu_us_per_call=transport["node_cpu_us_per_call"],
        lease_complete_urls_per_s_grpc=lc["urls_per_s"],
        lease_complete_urls_per_node_cpu_s_grpc=lc["urls_per_node_cpu_s"],
        lease_complete_urls_grpc=lc["urls"],
        lease_complete_hosts_ready=lc["hosts_ready_at_start"],
        lease_complete_node_cores_busy=lc["node_cores_busy"],
        lease_complete_reply_urls_per_s_grpc=lc_reply["urls_per_s"],
        lease_complete_reply_urls_per_node_cpu_s_grpc=lc_reply["urls_per_node_cpu_s"],
        lease_complete_reply_node_thread_us_per_url=lc_reply["node_thread_us_per_url"],
        discover_links_per_s_core_sqlite=core["discover_sqlite"]["links_per_s"],
        discover_links_per_cpu_s_core_sqlite=core["discover_sqlite"]["links_per_cpu_s"],
        discover_links_per_s_core_memory=core["discover_memory"]["links_per_s"],
        discover_links_per_cpu_s_core_memory=core["discover_memory"]["links_per_cpu_s"],
        discover_admitted_urls_core=core["discover_sqlite"]["admitted"],
        lease_complete_urls_per_s_core=core["lease_complete_sqlite"]["urls_per_s"],
        lease_complete_urls_per_cpu_s_core=core["lease_complete_sqlite"]["urls_per_cpu_s"],
        lease_complete_urls_per_s_core_memory=core["lease_complete_memory"]["urls_per_s"],
        lease_complete_urls_per_cpu_s_core_memory=core["lease_complete_memory"]["urls_per_cpu_s"],
        lease_complete_urls_per_s_core_batched=core["lease_complete_sqlite_batched"]["urls_per_s"],
        lease_complete_urls_per_cpu_s_core_batched=core["lease_complete_sqlite_batched"]["urls_per_cpu_s"],
        ram_bytes_per_url=ram["ram_bytes_per_url"],
        ram_anon_bytes_per_url=ram["anon_bytes_per_url"],
        seen_bytes_per_url=ram["seen_bytes_per_url"],
        ram_urls=ram["admitted"],
        ram_admit_per_s=ram["admit_per_s"],
        ram_admit_per_cpu_s=ram["admit_per_cpu_s"],
    )
    figures.update(
        peer_discover_links_per_s=peer["discover"]["links_per_s"],
        peer_discover_links_per_node_cpu_s=peer["discover"]["links_per_node_cpu_s"],
        peer_admitted_urls=peer["discover"]["admitted"],
        peer_drain_urls_per_s=peer["drain"]["urls_per_s"],
        peer_drain_urls_per_node_cpu_s=peer["drain"]["urls_per_node_cpu_s"],
        peer_drained_urls=peer["drain"]["pages"],
    )
    figures["workload"]["peer"] = pw.describe()
    figures["peer"] = peer
    figures["ram"] = ram
    end_of_run(figures["machine"])
    if profile_dir:
        figures["profiles"] = {
            name: profile_summary(profile_dir / f"{name}.txt")
            for name in ("discover", "lease_complete")
            if (profile_dir / f"{name}.txt").exists()
        }
    return figures


# (figure key, label, unit, key of the same figure per CPU-second or "")
_ROWS: tuple[tuple[str, str, str, str], ...] = (
    ("discover_links_per_s_grpc", "Discover through gRPC, journal on", "links/s", "discover_links_per_node_cpu_s_grpc"),
    ("lease_complete_urls_per_s_grpc", "Lease+Complete through gRPC", "URLs/s",
     "lease_complete_urls_per_node_cpu_s_grpc"),
    ("lease_complete_reply_urls_per_s_grpc", "Lease+Complete through gRPC, lease in reply", "URLs/s",
     "lease_complete_reply_urls_per_node_cpu_s_grpc"),
    ("grpc_floor_links_per_s", "gRPC alone: Discover, prebuilt reply", "links/s", "grpc_floor_links_per_server_cpu_s"),
    ("discover_links_per_s_core_sqlite", "Discover, core in process, SQLite", "links/s",
     "discover_links_per_cpu_s_core_sqlite"),
    ("discover_links_per_s_core_memory", "Discover, core in process, memory", "links/s",
     "discover_links_per_cpu_s_core_memory"),
    ("lease_complete_urls_per_s_core", "Lease+Complete, core, SQLite", "URLs/s", "lease_complete_urls_per_cpu_s_core"),
    ("lease_complete_urls_per_s_core_memory", "Lease+Complete, core, memory", "URLs/s",
     "lease_complete_urls_per_cpu_s_core_memory"),
    ("lease_complete_urls_per_s_core_batched", "Lease+Complete, core, SQLite, 1 flush/batch", "URLs/s",
     "lease_complete_urls_per_cpu_s_core_batched"),
    ("peer_discover_links_per_s", "issue workload: Discover through gRPC", "links/s",
     "peer_discover_links_per_node_cpu_s"),
    ("peer_drain_urls_per_s", "issue workload: drain, Lease+CompleteBatch", "URLs/s", "peer_drain_urls_per_node_cpu_s"),
    ("ram_bytes_per_url", "RAM (VmRSS) per admitted URL", "bytes", ""),
    ("ram_anon_bytes_per_url", "  of which anonymous memory", "bytes", ""),
    ("seen_bytes_per_url", "seen-set per URL", "bytes", ""),
    ("ram_admit_per_s", "admission rate during the RAM run", "URLs/s", "ram_admit_per_cpu_s"),
)  # fmt: skip


def over_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The first round's figures with each figure of the table replaced by its median over `rounds`, and every
    round's values of those figures under "rounds" (the machine's speed can move by a third within an hour)."""
    keys = [k for row in _ROWS for k in (row[0], row[3]) if k]
    out = {**rounds[0], "rounds": {k: [r[k] for r in rounds] for k in keys}}
    out.update({k: statistics.median(out["rounds"][k]) for k in keys})
    last = rounds[-1]["machine"]
    out["machine"] = {
        **rounds[0]["machine"],
        "loadavg_end": last["loadavg_end"],
        "reference_loop_ns_end": last["reference_loop_ns_end"],
    }
    return out


def _num(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def table(f: dict[str, Any]) -> str:
    """The figures as a readable table, machine and workload first; with rounds, medians and their ranges."""
    m, w = f["machine"], f["workload"]
    rounds: dict[str, list[float]] = f.get("rounds", {}) if len(f.get("rounds", {}).get(_ROWS[0][0], [])) > 1 else {}
    lines = [
        machine_line(m, sqlite=True),
        f"workload: {w['links']:,} links in batches of {w['batch']} over {w['hosts']:,} hosts "
        f"({w['unique_urls']:,} distinct, {w['duplicates']:,} duplicates; {w['duplicate_spellings']})",
        f"  node: {w['node']}",
        f"  Discover client: {w['discover_client']}",
        f"  gRPC alone: {w['grpc_floor']}, {f['grpc_floor_server_cpu_us_per_call']:,.0f} us of server CPU a call",
        f"  Lease+Complete client: {w['lease_client']}; {f['lease_complete_urls_grpc']:,} pages timed, "
        f"{f['lease_complete_hosts_ready']:,} hosts ready at the start",
        f"  Lease+Complete, lease in reply: {w['lease_reply_client']}",
        f"  core: {w['core']}; '1 flush/batch' commits once per Lease batch of completions",
        f"  revisits: {w['revisit']}",
        f"  issue workload: {w['peer']}; {f['peer_admitted_urls']:,} admitted, {f['peer_drained_urls']:,} drained",
        f"  RAM: {f['ram_urls']:,} URLs over {w['ram_hosts']:,} hosts; {w['ram']}",
        "  per CPU-s: the count over the CPU seconds of the process doing the work (the node process for gRPC "
        "figures), i.e. the rate with a core of its own",
        "",
        f"{'figure':<46} {'value':>10}  {'unit':<8} {'per CPU-s':>10} {'issue target':>13}"
        + (f"  {'range over ' + str(len(rounds[_ROWS[0][0]])) + ' rounds':>20}" if rounds else ""),
    ]
    for key, label, unit, per_cpu in _ROWS:
        cpu = _num(f[per_cpu]) if per_cpu else ""
        spread = f"  {_num(min(rounds[key])) + ' - ' + _num(max(rounds[key])):>20}" if rounds else ""
        lines.append(f"{label:<46} {_num(f[key]):>10}  {unit:<8} {cpu:>10} {TARGETS.get(key, ''):>13}{spread}")
    lines.append(
        f"(admitted through gRPC: {f['discover_admitted_urls_grpc']:,} URLs, {f['discover_duplicates_grpc']:,} "
        f"duplicates; node busy {f['discover_node_cores_busy']:.2f} cores during Discover, "
        f"{f['lease_complete_node_cores_busy']:.2f} during Lease+Complete)"
    )
    threads = [
        f"{label}: " + ", ".join(f"{name} {us:.1f}" for name, us in f[key].items())
        for key, label in (
            ("discover_node_thread_us_per_link", "Discover (per link)"),
            ("lease_complete_node_thread_us_per_url", "Lease+Complete (per URL)"),
            ("lease_complete_reply_node_thread_us_per_url", "lease in reply (per URL)"),
        )
        if f.get(key)
    ]
    if threads:
        lines.append("node CPU us by thread through gRPC (one GIL: they add up, not overlap): " + "; ".join(threads))
    for name, prof in f.get("profiles", {}).items():
        lines += ["", f"profile of the node during {name} (py-spy --gil, self time):"]
        lines += [f"  {share:5.1f}%  {frame}" for frame, share in prof["self"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.node", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test): small stream, 100k URLs")
    parser.add_argument("--streams", type=int, default=None, help="client threads for the gRPC figures")
    parser.add_argument(
        "--revisit",
        default="off",
        choices=["off", "fixed", "adaptive"],
        help="the node's revisit policy: every completed page gets a due time (a day away: none comes due)",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="record py-spy raw profiles of the node during the gRPC phases into DIR",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        metavar="N",
        help="run everything N times on fresh nodes and print each figure's median and range (default: 1)",
    )
    parser.add_argument("--ram-child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--ram-hosts", type=int, default=Workload.ram_hosts, help=argparse.SUPPRESS)
    parser.add_argument("--ram-batch", type=int, default=Workload.ram_batch, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ram_child:
        print(json.dumps(ram_child(args.ram_child, args.ram_hosts, args.ram_batch)))
        return 0
    w = QUICK if args.quick else Workload()
    pw = QUICK_PEER if args.quick else PeerWorkload()
    if args.streams:
        w = Workload(**{**asdict(w), "grpc_streams": args.streams})
    if args.revisit != "off":
        w = Workload(**{**asdict(w), "revisit": args.revisit})
    if args.py_spy:
        if shutil.which("py-spy") is None:
            parser.error("--py-spy needs the py-spy command (pip install py-spy)")
        args.py_spy.mkdir(parents=True, exist_ok=True)
    figures = over_rounds([run(w, pw, args.py_spy) for _ in range(args.rounds)])
    print(json.dumps(figures, indent=2) if args.json else table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
