"""The cluster harness of tests and benchmarks: a coordinator, frontier nodes and fetch workers as processes.

Every process is `python -m hostring_cli ...` in its own process group (`hostring_testing.proc.Proc`), so
`close` kills each one, whatever it started. The harness speaks to them over gRPC through the kernel's stubs
(`hostring.v1`), reads the ring the way every process builds it (`hostring.membership.ring_from_proto`), runs
short `hostring` commands (`seed`, `status`) and parses the processes' logs. It imports no service: judges that
read a service's store (the Redis journals, say) belong to the test or benchmark that needs them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, Self

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hostring.limits import grpc_options
from hostring.membership import ring_from_proto
from hostring.ring import Ring
from hostring.urls import ROBOTS_PREFIX, identify
from hostring.v1 import coordinator_pb2 as cpb
from hostring.v1 import coordinator_pb2_grpc as cpb_grpc
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from hostring_testing.crawls import LOOPBACK, UA, settled_at
from hostring_testing.proc import REPO, Proc, child_env, hostring_cmd, log_records

if TYPE_CHECKING:
    from hostring_testing.oracle import Oracle
    from hostring_testing.server import LocalWeb

__all__ = [
    "RPC_TIMEOUT_S",
    "Cluster",
    "Handoff",
    "assert_no_node_errors",
    "journals",
    "key_for_resource",
    "node_errors",
    "settled_at",
    "single_owner",
    "wait_for",
]

RPC_TIMEOUT_S = 10.0
_HANDOFF_LINE = re.compile(
    r"ring epoch (\d+): (\d+) members, released (\d+) domains, adopted (\d+)(?:, in ([0-9.]+)s)?"
)
_LET_GO_LINE = re.compile(r"let go of \d+ domain\(s\) early, fenced by a newer owner: \[(.*)\]")
_SERVING = health_pb2.HealthCheckResponse.SERVING


class Handoff(NamedTuple):
    """A node's own log line for one ring epoch: the members it saw, the domains it released and adopted, and
    how long the handoff took (None if the line did not say)."""

    members: int
    released: int
    adopted: int
    seconds: float | None


@dataclass
class Cluster:
    """A coordinator, nodes and workers as subprocesses, with stubs to each and a timeline of what happened.

    Nodes run `--delay DELAY` (and `--lease-s`, `--user-agent` when given); workers may fetch from loopback
    only and identify as hostring_testing.crawls.UA. Processes log at `log_level`. gRPC channels carry
    `channel_options` (a benchmark raises the receive limit for large batches).
    """

    log_dir: Path
    redis_url: str
    heartbeat_timeout: float
    delay: float = 0.0
    lease_s: float | None = None
    user_agent: str | None = UA
    log_level: str = "INFO"
    channel_options: Sequence[tuple[str, Any]] = ()
    node_args: Sequence[str] = ()
    """Extra `hostring node` flags (e.g. --max-depth)."""

    def __post_init__(self) -> None:
        self.procs: dict[str, Proc] = {}
        self.addresses: dict[str, str] = {}
        self.coordinator = ""
        self._channels: dict[str, grpc.Channel] = {}
        self.t0 = time.monotonic()
        self.timeline: list[tuple[float, str]] = []
        self.hits_of: Callable[[], int] = lambda: 0
        """What `note` appends to each line; a test sets it to count its web's requests."""

    # ---- lifecycle

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process started here (workers, then nodes, then the coordinator), by process group, and
        close the channels."""

        def rank(name: str) -> int:
            return 0 if name.startswith("w") else 2 if name == "coordinator" else 1

        for name in sorted(self.procs, key=rank):
            self.procs[name].stop(signal.SIGKILL)
        for channel in self._channels.values():
            channel.close()
        self._channels = {}

    def note(self, text: str) -> None:
        self.timeline.append((time.monotonic() - self.t0, f"{text} [server hits: {self.hits_of()}]"))

    def timeline_text(self) -> str:
        return "timeline:\n" + "\n".join(f"  {t:7.2f}s  {what}" for t, what in self.timeline)

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.procs.values())

    def _start(self, name: str, *args: str) -> Proc:
        proc = Proc(name, hostring_cmd("--log-level", self.log_level, *args), self.log_dir)
        self.procs[name] = proc
        return proc

    def start_coordinator(self, port: int = 0, name: str = "coordinator") -> None:
        """Start the coordinator (on `port`, e.g. the one a killed coordinator had, so every process finds it)."""
        proc = self._start(name, "coordinator", "--listen", f"127.0.0.1:{port}", "--redis", self.redis_url,
                           "--heartbeat-timeout", str(self.heartbeat_timeout))  # fmt: skip
        self.coordinator = f"127.0.0.1:{proc.port()}"
        self.note(f"{name} up at {self.coordinator}")

    def start_nodes(self, *node_ids: str) -> dict[str, Proc]:
        """Start nodes at once (their imports overlap), then wait for each one's port."""
        extra = [*(["--lease-s", str(self.lease_s)] if self.lease_s is not None else []),
                 *(["--user-agent", self.user_agent] if self.user_agent else [])]  # fmt: skip
        procs = {
            node_id: self._start(node_id, "node", "--coordinator", self.coordinator, "--id", node_id,
                                 "--listen", "127.0.0.1:0", "--store", self.redis_url, "--delay", str(self.delay),
                                 *extra, *self.node_args)
            for node_id in node_ids
        }  # fmt: skip
        for node_id, proc in procs.items():
            self.addresses[node_id] = f"127.0.0.1:{proc.port()}"
            self.note(f"node {node_id} listening at {self.addresses[node_id]}")
        return procs

    def start_workers(self, *worker_ids: str, until_drained: bool = False) -> None:
        """Start workers; with `until_drained` each exits once every node says it is drained (its exit code
        and last words are then the judge)."""
        for wid in worker_ids:
            self._start(wid, "worker", "--coordinator", self.coordinator, "--allow-network", LOOPBACK, "--id", wid,
                        *(["--user-agent", self.user_agent] if self.user_agent else []),
                        "--fetch-timeout", "10", "--grace", "1",
                        *(["--until-drained"] if until_drained else []))  # fmt: skip
        self.note(f"workers {', '.join(worker_ids)} started")

    # ---- gRPC

    def channel(self, address: str) -> grpc.Channel:
        """One channel per address, kept until `close`."""
        channel = self._channels.get(address)
        if channel is None:
            options = [*grpc_options(), *self.channel_options]
            channel = self._channels[address] = grpc.insecure_channel(address, options=options)
        return channel

    def ring(self) -> Ring:
        stub = cpb_grpc.CoordinatorStub(self.channel(self.coordinator))  # type: ignore[no-untyped-call]
        return ring_from_proto(stub.GetRing(cpb.GetRingRequest(), timeout=RPC_TIMEOUT_S))

    def frontier(self, node_id: str) -> pb_grpc.FrontierStub:
        return pb_grpc.FrontierStub(self.channel(self.addresses[node_id]))  # type: ignore[no-untyped-call]

    def stats(self, node_id: str) -> pb.StatsResponse:
        with self._failing(node_id, "Stats"):
            stats: pb.StatsResponse = self.frontier(node_id).Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
        return stats

    @contextlib.contextmanager
    def _failing(self, node_id: str, method: str) -> Iterator[None]:
        """Turn a failed call into an AssertionError that quotes the exception the node logged, if any."""
        try:
            yield
        except grpc.RpcError as e:
            code = e.code() if callable(getattr(e, "code", None)) else None
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise  # transient: callers that poll retry
            details = _safe(e.details) if callable(getattr(e, "details", None)) else ""
            logged = node_errors(self, [node_id]).get(node_id, "nothing logged")
            raise AssertionError(f"{method} on {node_id} failed: {code} {details}; the node logged: {logged}") from None

    def serving(self, node_id: str) -> bool:
        stub = health_pb2_grpc.HealthStub(self.channel(self.addresses[node_id]))
        status: int = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S).status
        return bool(status == _SERVING)

    def report(self, node_id: str) -> dict[str, Any]:
        with self._failing(node_id, "Report"):
            resp = self.frontier(node_id).Report(pb.ReportRequest(dispositions=True), timeout=RPC_TIMEOUT_S)
        report: dict[str, Any] = json.loads(resp.json)
        return report

    def settled(self, members: set[str]) -> Ring | None:
        """The coordinator's ring when it has exactly `members` and every one of them applied it and is SERVING."""
        try:
            ring = self.ring()
            if set(ring.members) != members:
                return None
            for node_id in members:
                if self.stats(node_id).ring_epoch != ring.epoch or not self.serving(node_id):
                    return None
        except grpc.RpcError:
            return None
        return ring

    def wait_settled(self, members: set[str], timeout: float, interval: float = 0.05) -> Ring:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ring = self.settled(members)
            if ring is not None:
                return ring
            time.sleep(interval)
        raise AssertionError(
            f"ring did not settle on {sorted(members)} within {timeout}s (coordinator: {_safe(self.ring)})"
        )

    # ---- the CLI

    def cli(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a short `hostring` command to its end (bounded), in its own process group."""
        proc = subprocess.Popen(
            hostring_cmd(*args), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, start_new_session=True, env=child_env(),
        )  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10)
            raise AssertionError(f"hostring {' '.join(args)} did not end within {timeout}s") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def seed(self, urls: Sequence[str]) -> str:
        seeds = self.log_dir / "seeds.txt"
        seeds.write_text("\n".join(urls) + "\n", encoding="utf-8")
        done = self.cli("seed", "--coordinator", self.coordinator, "--file", str(seeds))
        assert done.returncode == 0, f"hostring seed failed ({done.returncode}): {done.stdout}{done.stderr[-2000:]}"
        self.note(f"seeded: {done.stdout.strip()}")
        return done.stdout

    def status(self) -> tuple[str, dict[str, Any]]:
        """`hostring status` as text and as JSON."""
        text = self.cli("status", "--coordinator", self.coordinator)
        assert text.returncode == 0, text.stderr[-2000:]
        js = self.cli("status", "--coordinator", self.coordinator, "--json")
        assert js.returncode == 0, js.stderr[-2000:]
        parsed: dict[str, Any] = json.loads(js.stdout)
        return text.stdout, parsed

    # ---- ownership as the nodes report it

    def reported_owners(self, node_ids: Sequence[str]) -> dict[str, set[str]]:
        """domain -> the nodes whose Report lists URLs of it (rows of domains whose fence names the node)."""
        owners: dict[str, set[str]] = {}
        for node_id in node_ids:
            for row in self.report(node_id)["dispositions"]:
                owners.setdefault(identify(row["url"]).domain, set()).add(node_id)
        return owners

    def let_go(self, node_id: str) -> set[str]:
        """Domains the node let go of early, when a newer owner's fence refused its writes before its own ring
        said so (its log line names up to 50 per refusal)."""
        out: set[str] = set()
        for msg, _ in log_records(self.procs[node_id].log()):
            m = _LET_GO_LINE.search(msg)
            if m is not None:
                out.update(d.strip().strip("'\"") for d in m.group(1).split(",") if d.strip())
        return out

    def handoffs(self, node_id: str) -> dict[int, Handoff]:
        """epoch -> the node's own "ring epoch ..." log line for it."""
        out = {}
        for msg, _ in log_records(self.procs[node_id].log()):
            m = _HANDOFF_LINE.search(msg)
            if m is not None:
                seconds = float(m.group(5)) if m.group(5) is not None else None
                out[int(m.group(1))] = Handoff(int(m.group(2)), int(m.group(3)), int(m.group(4)), seconds)
        return out


def node_errors(c: Cluster, node_ids: Sequence[str]) -> dict[str, str]:
    """node -> the first exception its process logged (message and the traceback's last lines), for nodes that did."""
    out: dict[str, str] = {}
    for node_id in node_ids:
        failed = [(m, e) for m, e in log_records(c.procs[node_id].log()) if e or "Traceback" in m]
        if failed:
            msg, exc = failed[0]
            out[node_id] = f"{len(failed)} logged exception(s), first: {msg}\n" + "\n".join(exc.splitlines()[-6:])
    return out


def assert_no_node_errors(c: Cluster, node_ids: Sequence[str], when: str) -> None:
    errors = node_errors(c, node_ids)
    assert not errors, f"{when}: nodes failed calls:\n" + "\n".join(f"{n}: {e}" for n, e in errors.items())


def single_owner(owners: dict[str, set[str]]) -> dict[str, str]:
    """domain -> its one reporting node; AssertionError naming domains that two nodes report."""
    doubled = {d: sorted(ns) for d, ns in owners.items() if len(ns) != 1}
    assert not doubled, f"domains reported by more than one node: {doubled}"
    return {d: next(iter(ns)) for d, ns in owners.items()}


def _safe(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as e:  # for messages only
        return repr(e)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> float:
    """Poll until `predicate` holds; the seconds it took. AssertionError naming `what` after `timeout`."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - start


class JournalSource(Protocol):
    """What journals() reads: a Redis store's domains and their exports (frontier_node's RedisStore)."""

    def all_domains(self) -> Iterable[str]: ...

    def export_domain(self, domain: str) -> dict[str, Any]: ...


def key_for_resource(web: LocalWeb, oracle: Oracle, origin: str, resource: str) -> str:
    """The fetch key (or robots item key) a server-side (origin, resource) was requested under."""
    label = web.labels[origin]
    if resource == "/robots.txt":
        return ROBOTS_PREFIX + identify(web.url(label)).origin
    for home, target in oracle.robots_redirects.items():
        if target == (label, resource):
            return ROBOTS_PREFIX + identify(web.url(home)).origin
    return identify(origin + resource).fetch_key


def journals(judge: JournalSource) -> dict[str, list[dict[str, Any]]]:
    """fetch key -> its journal lines from every writer, in applied order (epoch, seq), from Redis."""
    out: dict[str, list[dict[str, Any]]] = {}
    for domain in sorted(judge.all_domains()):
        for line in judge.export_domain(domain)["journal"]:
            _seq, _run_id, key, attempt, generation, frm, event, to, at, *_ = line["entry"]
            out.setdefault(key, []).append(
                {
                    "writer": line["writer"],
                    "epoch": line["epoch"],
                    "event": event,
                    "from": frm,
                    "to": to,
                    "gen": generation,
                    "attempt": attempt,
                    "at": at,
                }
            )
    return out
