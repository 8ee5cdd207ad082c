"""The cluster commands of `hostring`: coordinator, worker, status, seed and hosts (node lives in cli.py).

Every command that opens a gRPC connection takes `--tls-cert/--tls-key/--tls-ca` and builds its channels through
`hostring.security.TlsConfig`, so a process talks to a TLS cluster exactly as the cluster talks to itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import grpc

from hostring import logs
from hostring.agent import product_token
from hostring.limits import grpc_options
from hostring.security import SecurityConfigError, TlsConfig, admin_metadata, load_admin_token
from hostring.v1 import coordinator_pb2 as cpb
from hostring.v1 import coordinator_pb2_grpc as cpb_grpc
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from hostring_cli.args import (
    MAX_RESPONSE_BYTES,
    Parser,
    UsageError,
    cidr,
    listen_address,
    make_dir,
    non_negative_float,
    nonblank_path,
    port,
    positive_float,
    positive_int,
    timeout_s,
    utf8,
)
from hostring_cli.args import address as address_arg
from hostring_cli.args import user_agent as agent_arg
from hostring_cli.errors import DependencyError, check_redis_url, redis_errors, redis_failure, rpc_failure
from hostring_cli.parent import exit_with_parent
from hostring_cli.workers import COUNTS_EVERY_S, Counts, worker_counts, write_counts

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from fetch_worker.metrics import WorkerMetrics
    from fetch_worker.worker import Worker

log = logging.getLogger("hostring.cli")

# ---------------------------------------------------------------------------------------------- shared flags


def add_tls_flags(p: argparse.ArgumentParser, *, server: bool) -> None:
    """--tls-cert/--tls-key/--tls-ca, worded for a server (which also dials out) or a client only."""
    g = p.add_argument_group("TLS (all three are PEM files; without them gRPC is plaintext)")
    if server:
        g.add_argument(
            "--tls-cert",
            metavar="PEM",
            help="this process's certificate chain: serve TLS, and present it to the coordinator/nodes it connects to",
        )
        g.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
        g.add_argument(
            "--tls-ca",
            metavar="PEM",
            help="CA bundle: verify servers, and require and verify client certificates (mutual TLS)",
        )
    else:
        g.add_argument("--tls-cert", metavar="PEM", help="client certificate chain (for servers that use mutual TLS)")
        g.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
        g.add_argument(
            "--tls-ca",
            metavar="PEM",
            help="CA bundle that signed the servers' certificates (default: the system's roots)",
        )


def add_token_flag(p: argparse.ArgumentParser, *, server: bool) -> None:
    """--admin-token-file: the token a server checks on administrative calls, or the one a client sends."""
    what = (
        "require this bearer token on administrative calls (and send it to the coordinator)"
        if server
        else "send this bearer token on administrative calls"
    )
    p.add_argument(
        "--admin-token-file",
        metavar="PATH",
        help=f"{what}; default: $HOSTRING_ADMIN_TOKEN. Without a token administrative calls are open.",
    )


def tls_from(args: argparse.Namespace) -> TlsConfig:
    """The process's TlsConfig from its flags; a usage error for unreadable or incomplete settings."""
    try:
        return TlsConfig.from_args(args)
    except SecurityConfigError as e:
        raise UsageError(str(e)) from e


def token_from(args: argparse.Namespace) -> str | None:
    """The admin token from --admin-token-file or $HOSTRING_ADMIN_TOKEN (None when neither is set)."""
    try:
        return load_admin_token(getattr(args, "admin_token_file", None))
    except SecurityConfigError as e:
        raise UsageError(str(e)) from e


# ---------------------------------------------------------------------------------------------- processes


def cmd_coordinator(args: argparse.Namespace) -> int:
    from coordinator.server import serve_forever, start_coordinator

    tls = tls_from(args)
    if args.redis:
        check_redis_url(args.redis, "--redis")
    logs.bind(role="coordinator")
    try:
        coord = start_coordinator(
            args.listen,
            redis_url=args.redis or None,
            heartbeat_timeout_s=args.heartbeat_timeout,
            tls=tls,
            admin_token=token_from(args),
        )
    except redis_errors() as e:
        raise redis_failure(e, args.redis, "--redis") from None
    except OSError as e:
        raise DependencyError(f"cannot serve on --listen {args.listen}: {e}") from e
    metrics = ""
    if args.metrics_port is not None:
        from coordinator.metrics import coordinator_registry

        bound = _serve_metrics(
            args.metrics_port,
            coordinator_registry(coord.service.membership, coord.redis_client),
            f"{args.metrics_listen}:0" if args.metrics_listen else args.listen,
        )
        metrics = f", metrics on port {bound}"
    print(
        f"hostring coordinator listening on port {coord.port}"
        f" ({'membership in ' + args.redis if args.redis else 'membership in memory'}{metrics})",
        flush=True,
    )
    serve_forever(coord)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    if args.exit_with_parent is not None:
        exit_with_parent(args.exit_with_parent)
    from fetch_worker.fetch import Fetcher, body_limits
    from fetch_worker.metrics import WorkerMetrics
    from fetch_worker.netpolicy import NetworkPolicy
    from fetch_worker.warc import WarcWriter
    from fetch_worker.worker import Worker
    from hostring.client import Router, StaticRouter
    from hostring.membership import RingWatcher

    try:
        policy = NetworkPolicy(args.allow_network)
    except ValueError as e:
        raise UsageError(f"--allow-network: {e}") from e
    tls = tls_from(args)
    if args.out:  # before connecting: a place the worker cannot write to is a usage error, not a failure at its end
        make_dir(args.out, "--out")
    try:
        if args.counts_file:
            write_counts(Path(args.counts_file), Counts())
    except OSError as e:
        raise UsageError(f"--counts-file {args.counts_file}: cannot write it ({e.strerror})") from e

    async def run() -> None:
        router: Router
        watcher: RingWatcher | None = None
        if args.node:
            router, source = StaticRouter(args.node, tls=tls), f"node {args.node}"
        else:
            watcher = RingWatcher(args.coordinator, tls=tls)
            try:
                await watcher.start(timeout=args.connect_timeout)
            except grpc.RpcError as e:
                raise rpc_failure(e, "coordinator", args.coordinator, "--coordinator") from None
            router, source = watcher, f"ring epoch {watcher.ring.epoch}"
        if not args.out:
            log.warning("no --out: fetched pages are not kept (no WARC files); give --out DIR to keep them")
        limits = body_limits(args.max_response_bytes, args.fetch_timeout)
        fetcher = Fetcher(policy, args.user_agent, limits, max_connections=args.fetchers)
        warc = WarcWriter(Path(args.out), prefix=f"hostring-{args.id or 'worker'}") if args.out else None
        counts_file = Path(args.counts_file) if args.counts_file else None
        metrics = WorkerMetrics() if args.metrics_port is not None or counts_file is not None else None
        worker = Worker(
            router,
            fetcher,
            warc=warc,
            worker_id=args.id,
            max_in_flight=args.fetchers,
            product_token=product_token(args.user_agent),
            metrics=metrics,
            channel_options=grpc_options(),
        )
        logs.bind(role="worker", worker=worker.worker_id)
        announce = ""
        if metrics is not None and args.metrics_port is not None:
            bound = _serve_metrics(args.metrics_port, metrics.registry, f"{args.metrics_listen}:0")
            announce = f", metrics on port {bound}"
        stop, force = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: force.set() if stop.is_set() else stop.set())
        print(f"hostring worker {worker.worker_id} leasing from {source}{announce}", flush=True)
        counting = asyncio.create_task(_keep_counts(counts_file, worker, metrics)) if counts_file else None
        try:
            await worker.run(stop, until_drained=args.until_drained, grace_s=args.grace, force=force)
        finally:
            if counts_file is not None and counting is not None:
                counting.cancel()
                write_counts(counts_file, worker_counts(worker, metrics))
            await worker.close()
            if watcher is not None:
                await watcher.close()

    from hostring.client import NodeStoreLost

    try:
        asyncio.run(run())
    except NodeStoreLost as e:
        print(f"hostring worker: {e}", file=sys.stderr)
        return 3
    return 0


def _serve_metrics(port: int, registry: CollectorRegistry, listen: str) -> int:
    """serve_metrics, its failures in words: a host that does not resolve (exit 2), a port that cannot be bound."""
    from hostring.metrics import serve_metrics

    host = listen.rpartition(":")[0]
    try:
        return serve_metrics(port, registry, listen)
    except socket.gaierror as e:
        raise UsageError(f"--metrics-listen {host}: not a host or address here ({e.strerror})") from e
    except OSError as e:
        raise DependencyError(
            f"cannot serve /metrics on {host or '0.0.0.0'}:{port}: {e.strerror or e}; free the port or pick another "
            "--metrics-port (or --metrics-listen)"
        ) from e


async def _keep_counts(path: Path, worker: Worker, metrics: WorkerMetrics | None) -> None:
    """Rewrite `path` with the worker's counts every COUNTS_EVERY_S (hostring_cli/workers.py reads them)."""
    while True:
        write_counts(path, worker_counts(worker, metrics))
        await asyncio.sleep(COUNTS_EVERY_S)


# ---------------------------------------------------------------------------------------------- status and seed


def _ring(coordinator: str, timeout: float, tls: TlsConfig) -> cpb.RingState:
    try:
        with tls.channel(coordinator) as channel:
            stub = cpb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call]
            ring: cpb.RingState = stub.GetRing(cpb.GetRingRequest(), timeout=timeout)
            return ring
    except grpc.RpcError as e:
        raise rpc_failure(e, "coordinator", coordinator, "--coordinator") from None


def cmd_status(args: argparse.Namespace) -> int:
    tls = tls_from(args)
    ring = _ring(args.coordinator, args.timeout, tls)
    rows = []
    for m in ring.members:
        row = {"node": m.node_id, "address": m.address, "weight": m.weight, "healthy": m.healthy}
        try:
            with tls.channel(m.address) as channel:
                s = pb_grpc.FrontierStub(channel).Stats(pb.StatsRequest(), timeout=args.timeout)  # type: ignore[no-untyped-call]
            row.update(
                epoch=s.ring_epoch,
                domains=s.owned_domains,
                queued=s.queued,
                in_flight=s.in_flight,
                hosts=s.hosts_with_work,
                fetched=dict(s.urls_by_state).get("fetched", 0),
            )
        except grpc.RpcError as e:
            row["error"] = e.code().name
        rows.append(row)
    if args.json:
        json.dump({"ring_epoch": ring.epoch, "nodes": rows}, sys.stdout, indent=2)
        print()
        return 0
    print(f"ring epoch {ring.epoch}, {len(rows)} node(s)")
    header = (
        f"{'node':<12} {'address':<22} {'w':>2} {'ok':>3} {'epoch':>6} {'domains':>8} {'queued':>8} "
        f"{'in flight':>9} {'hosts':>6} {'fetched':>8}"
    )
    print(header)
    for r in rows:
        if "error" in r:
            print(f"{r['node']:<12} {r['address']:<22} {r['weight']:>2} {'no':>3}  unreachable: {r['error']}")
            continue
        print(
            f"{r['node']:<12} {r['address']:<22} {r['weight']:>2} {'yes' if r['healthy'] else 'no':>3} "
            f"{r['epoch']:>6} {r['domains']:>8} {r['queued']:>8} {r['in_flight']:>9} {r['hosts']:>6} "
            f"{r['fetched']:>8}"
        )
    return 0


def cmd_seed(args: argparse.Namespace) -> int:
    from hostring.client import NodeClients
    from hostring.membership import RingWatcher
    from hostring_cli.crawl import read_seeds

    seeds = read_seeds(args.urls, Path(args.seeds_file) if args.seeds_file else None)
    if not seeds:
        raise UsageError("give URLs to seed, or --seeds-file FILE")
    tls = tls_from(args)
    links = [pb.Link(observed=s, seed=True) for s in seeds]
    if args.node:
        try:
            with _frontier(tls, args.node) as stub:
                resp = stub.Discover(pb.DiscoverRequest(links=links), timeout=args.timeout)
        except grpc.RpcError as e:
            raise rpc_failure(e, "frontier node", args.node, "--node") from None
        verdicts = Counter(pb.Verdict.Name(v.verdict).lower() for v in resp.verdicts)
        print(f"seeded node {args.node}: " + ", ".join(f"{k} {n}" for k, n in sorted(verdicts.items())))
        return 0

    async def run() -> int:
        watcher = RingWatcher(args.coordinator, tls=tls)
        try:
            await watcher.start(timeout=args.timeout)
        except grpc.RpcError as e:
            raise rpc_failure(e, "coordinator", args.coordinator, "--coordinator") from None
        clients = NodeClients(watcher, worker_id="seed")
        try:
            lost = await clients.route(links)
        finally:
            await clients.close()
            await watcher.close()
        print(
            f"seeded {len(seeds) - lost} URL(s) into ring epoch {watcher.ring.epoch}"
            + (f"; {lost} found no owner" if lost else "")
        )
        return 1 if lost else 0

    return asyncio.run(run())


# ---------------------------------------------------------------------------------------------- hosts


def _host_name(text: str) -> str:
    """A host as the frontier keys it (lower case, no trailing dot); a URL is accepted for convenience."""
    try:
        host = (urlsplit(text).hostname or "" if "://" in text else text).strip().lower().rstrip(".")
    except ValueError as e:  # urlsplit: an unclosed [IPv6 bracket
        raise UsageError(f"not a host name or URL: {text!r} ({e})") from None
    if not host:
        raise UsageError(f"not a host name: {text!r}")
    return host


def _host_row(info: pb.HostInfo, node: str) -> dict[str, Any]:
    row: dict[str, Any] = {f.name: getattr(info, f.name) for f in info.DESCRIPTOR.fields}
    row["node"] = node
    row["next_eligible_s"] = max(0.0, row["next_eligible_s"])  # <= 0 means ready; the raw figure is meaningless
    return row


def _node_for(args: argparse.Namespace, tls: TlsConfig, host: str | None) -> list[str]:
    """The node(s) to ask: --node, else via the coordinator's ring the owner of `host`'s domain (or every node)."""
    if args.node:
        return [args.node]
    if not args.coordinator:
        raise UsageError("give --node ADDR or --coordinator ADDR")
    from hostring.domains import registrable_domain
    from hostring.membership import ring_from_proto

    ring = ring_from_proto(_ring(args.coordinator, args.timeout, tls))
    if host is None:
        return [m.address for m in ring.members.values()]
    owner = ring.owner(registrable_domain(host))
    if owner is None:
        raise DependencyError(f"the ring of {args.coordinator} (epoch {ring.epoch}) has no nodes")
    return [owner.address]


@contextlib.contextmanager
def _frontier(tls: TlsConfig, address: str, flag: str = "--node") -> Iterator[pb_grpc.FrontierStub]:
    """A Frontier stub on a channel closed when the block ends; a failed call is said in words naming `flag`."""
    with tls.channel(address) as channel:
        try:
            yield pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
        except grpc.RpcError as e:
            raise rpc_failure(e, "frontier node", address, flag) from None


def _fmt_next(seconds: float) -> str:
    return "ready" if seconds <= 0 else f"{seconds:.1f}"


def print_hosts(rows: list[dict[str, Any]], *, with_node: bool) -> None:
    """The host table of `hostring hosts list`."""
    width = max([len("host"), *(len(r["host"]) for r in rows)])
    node = f" {'node':<21}" if with_node else ""
    print(
        f"{'host':<{width}}{node} {'queued':>7} {'flight':>6} {'conc':>4} {'delay s':>7} {'backoff':>7} "
        f"{'next s':>7} {'paused':>6} {'fetched':>7} {'errors':>6}"
    )
    for r in rows:
        node = f" {r['node']:<21}" if with_node else ""
        print(
            f"{r['host']:<{width}}{node} {r['queued']:>7} {r['in_flight']:>6} {r['concurrency']:>4} "
            f"{r['delay_s']:>7.2f} {r['backoff']:>7.2f} {_fmt_next(r['next_eligible_s']):>7} "
            f"{'yes' if r['paused'] else 'no':>6} {r['fetched']:>7} {r['errors']:>6}"
        )


def print_host(r: dict[str, Any]) -> None:
    """One host, field by field (`hostring hosts show`, and after pause/resume/policy)."""
    lines = [
        ("host", r["host"]),
        ("domain", r["domain"]),
        ("node", r["node"]),
        ("queued", r["queued"]),
        ("in flight", f"{r['in_flight']} of {r['concurrency']}"),
        ("delay", f"{r['delay_s']:.2f} s (minimum {r['min_delay_s']:.2f} s, backoff x{r['backoff']:.2f})"),
        ("next request", "ready now" if r["next_eligible_s"] <= 0 else f"in {r['next_eligible_s']:.2f} s"),
        ("paused", "yes" if r["paused"] else "no"),
        ("fetched", r["fetched"]),
        ("errors", r["errors"]),
    ]
    for name, value in lines:
        print(f"{name:<13} {value}")
    for i, robots in enumerate(r["robots"].split("; ") if r["robots"] else ["unknown"]):
        print(f"{'robots' if i == 0 else '':<13} {robots}")


def _where(args: argparse.Namespace) -> str:
    """The flag that chose the node a hosts command asks (for its error line)."""
    return "--node" if args.node else f"found through --coordinator {args.coordinator}"


def _emit(args: argparse.Namespace, row: dict[str, Any]) -> None:
    if args.json:
        json.dump(row, sys.stdout, indent=2, sort_keys=True)
        print()
    else:
        print_host(row)


def cmd_hosts_list(args: argparse.Namespace) -> int:
    tls = tls_from(args)
    rows: list[dict[str, Any]] = []
    for address in _node_for(args, tls, None):
        with _frontier(tls, address, _where(args)) as stub:
            resp = stub.ListHosts(
                pb.ListHostsRequest(limit=args.limit, only_with_work=args.with_work), timeout=args.timeout
            )
            rows += [_host_row(h, address) for h in resp.hosts]
    rows.sort(key=lambda r: (-r["queued"], r["host"]))
    rows = rows[: args.limit]
    if args.json:
        json.dump({"hosts": rows}, sys.stdout, indent=2, sort_keys=True)
        print()
        return 0
    if not rows:
        print("no hosts" + (" with work" if args.with_work else ""))
        return 0
    print_hosts(rows, with_node=not args.node)
    return 0


def cmd_hosts_show(args: argparse.Namespace) -> int:
    tls = tls_from(args)
    host = _host_name(args.host)
    (address,) = _node_for(args, tls, host)
    with _frontier(tls, address, _where(args)) as stub:
        _emit(args, _host_row(stub.GetHost(pb.GetHostRequest(host=host), timeout=args.timeout), address))
    return 0


def _admin_call(args: argparse.Namespace, method: str, request: Any) -> int:
    tls = tls_from(args)
    metadata = admin_metadata(token_from(args))
    (address,) = _node_for(args, tls, request.host)
    with _frontier(tls, address, _where(args)) as stub:
        info = getattr(stub, method)(request, timeout=args.timeout, metadata=metadata)
        _emit(args, _host_row(info, address))
    return 0


def cmd_hosts_pause(args: argparse.Namespace) -> int:
    return _admin_call(args, "PauseHost", pb.PauseHostRequest(host=_host_name(args.host), paused=True))


def cmd_hosts_resume(args: argparse.Namespace) -> int:
    return _admin_call(args, "PauseHost", pb.PauseHostRequest(host=_host_name(args.host), paused=False))


def cmd_hosts_policy(args: argparse.Namespace) -> int:
    if args.delay is None and args.concurrency is None:
        raise UsageError("hosts policy: give --delay and/or --concurrency")
    request = pb.SetHostPolicyRequest(
        host=_host_name(args.host),
        min_delay_s=args.delay if args.delay is not None else -1.0,  # negative: unchanged
        concurrency=args.concurrency or 0,  # 0: unchanged
    )
    return _admin_call(args, "SetHostPolicy", request)


def _add_hosts_commands(sub: argparse._SubParsersAction[Parser]) -> None:
    hosts = sub.add_parser(
        "hosts",
        help="list, inspect, pause, resume hosts and set their politeness",
        description="Inspect and steer the hosts a frontier node schedules. Ask one node with --node, or give "
        "--coordinator and the command asks the node owning the host's registrable domain (list asks every "
        "node). pause, resume and policy are administrative calls: they send the admin token "
        "($HOSTRING_ADMIN_TOKEN or --admin-token-file).",
    )
    verbs = hosts.add_subparsers(dest="hosts_command", required=True, metavar="VERB")

    def common(p: argparse.ArgumentParser, *, admin: bool = False) -> None:
        where = p.add_mutually_exclusive_group(required=True)
        where.add_argument("--node", type=address_arg, metavar="ADDR", help="the frontier node to ask")
        where.add_argument(
            "--coordinator", type=address_arg, metavar="ADDR", help="find the owning node(s) through this coordinator"
        )
        p.add_argument("--json", action="store_true", help="JSON instead of a table")
        p.add_argument("--timeout", type=timeout_s, default=10.0, metavar="S", help="how long to wait for answers")
        add_tls_flags(p, server=False)
        if admin:
            add_token_flag(p, server=False)

    ls = verbs.add_parser("list", help="hosts by queue depth", description="Hosts, deepest queue first.")
    ls.add_argument("--limit", type=positive_int, default=50, metavar="N", help="at most N hosts")
    ls.add_argument("--with-work", action="store_true", help="only hosts with queued or leased URLs")
    common(ls)
    ls.set_defaults(func=cmd_hosts_list)

    show = verbs.add_parser("show", help="one host: queue, delay, backoff, robots", description="One host in detail.")
    show.add_argument("host", type=utf8, metavar="HOST", help="a host name (or a URL on it)")
    common(show)
    show.set_defaults(func=cmd_hosts_show)

    for verb, func, text in (
        ("pause", cmd_hosts_pause, "stop leasing URLs of HOST (admin)"),
        ("resume", cmd_hosts_resume, "lease URLs of a paused HOST again (admin)"),
    ):
        p = verbs.add_parser(verb, help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument("host", type=utf8, metavar="HOST", help="a host name (or a URL on it)")
        common(p, admin=True)
        p.set_defaults(func=func)

    pol = verbs.add_parser(
        "policy",
        help="set HOST's minimum delay and/or concurrency (admin)",
        description="Set HOST's politeness: minimum seconds between requests and requests in "
        "flight. Flags not given stay as they are.",
    )
    pol.add_argument("host", type=utf8, metavar="HOST", help="a host name (or a URL on it)")
    pol.add_argument(
        "--delay", type=non_negative_float, default=None, metavar="S", help="minimum seconds between two requests"
    )
    pol.add_argument("--concurrency", type=positive_int, default=None, metavar="N", help="requests in flight at once")
    common(pol, admin=True)
    pol.set_defaults(func=cmd_hosts_policy)


# ---------------------------------------------------------------------------------------------- parser


def _node_or_coordinator(p: argparse.ArgumentParser, what: str) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--coordinator",
        type=address_arg,
        metavar="ADDR",
        help=f"a cluster's coordinator: {what} every node of its ring",
    )
    where.add_argument("--node", type=address_arg, metavar="ADDR", help=f"a standalone frontier node: {what} it alone")


def add_cluster_commands(sub: argparse._SubParsersAction[Parser], user_agent: str) -> None:
    """Register coordinator, worker, status, seed and hosts on the `hostring` parser."""
    c = sub.add_parser(
        "coordinator",
        help="run the coordinator: membership and ring epochs",
        description="Keep cluster membership and publish the ring; in Redis with --redis, so it survives restarts.",
    )
    c.add_argument(
        "--listen", type=listen_address, default="127.0.0.1:50050", metavar="HOST:PORT", help="address to serve on"
    )
    c.add_argument("--redis", default="", metavar="URL", help="keep membership and epochs in this Redis")
    c.add_argument(
        "--heartbeat-timeout",
        type=positive_float,
        default=10.0,
        metavar="S",
        help="a node silent this long leaves the ring",
    )
    c.add_argument("--metrics-port", type=port, default=None, metavar="PORT", help="serve Prometheus /metrics")
    c.add_argument(
        "--metrics-listen",
        default="",
        metavar="HOST",
        help="the interface /metrics is served on (default: the --listen host)",
    )
    add_token_flag(c, server=True)
    add_tls_flags(c, server=True)
    c.set_defaults(func=cmd_coordinator)

    w = sub.add_parser(
        "worker",
        help="run a stateless fetch worker against a cluster or a standalone node",
        description="Lease from every node of the ring (or from one standalone node), fetch safely, write WARC, "
        "route links. SIGTERM or Ctrl-C lets the fetches in flight finish (--grace) and hands the rest back; a "
        "second one hands them back at once.",
    )
    _node_or_coordinator(w, "lease from")
    w.add_argument("--id", type=utf8, default="", help="worker id (default: random)")
    w.add_argument(
        "--allow-network",
        action="append",
        type=cidr,
        default=[],
        metavar="CIDR",
        help="let the fetcher connect to these otherwise refused addresses; repeatable",
    )
    w.add_argument(
        "--user-agent",
        type=agent_arg,
        default=user_agent,
        metavar="UA",
        help="User-Agent sent with every request, and whose product token X-Robots-Tag scopes are matched by",
    )
    w.add_argument(
        "--out", default="", metavar="DIR", help="write WARC files here (default: none, and a warning: nothing is kept)"
    )
    w.add_argument("--fetchers", type=positive_int, default=64, metavar="N", help="fetches in flight")
    w.add_argument(
        "--fetch-timeout", type=positive_float, default=60.0, metavar="S", help="total time one fetch may take"
    )
    w.add_argument(
        "--max-response-bytes",
        type=positive_int,
        default=MAX_RESPONSE_BYTES,
        metavar="N",
        help="largest body read, on the wire",
    )
    w.add_argument(
        "--grace",
        type=non_negative_float,
        default=10.0,
        metavar="S",
        help="on SIGTERM, time for in-flight fetches to finish before they are handed back",
    )
    w.add_argument("--until-drained", action="store_true", help="exit when every node has no work left")
    w.add_argument(
        "--connect-timeout",
        type=timeout_s,
        default=30.0,
        metavar="S",
        help="how long to wait for the coordinator at start",
    )
    w.add_argument("--metrics-port", type=port, default=None, metavar="PORT", help="serve Prometheus /metrics")
    w.add_argument(
        "--metrics-listen",
        default="127.0.0.1",
        metavar="HOST",
        help="the interface /metrics is served on; 0.0.0.0 for a Prometheus on another machine or pod",
    )
    w.add_argument(
        "--counts-file",
        default=None,
        metavar="PATH",
        help="rewrite PATH every second and at the end with this worker's counts as JSON (fetched, errors, "
        "requests, bytes), as `hostring crawl --workers N` reads its children's",
    )
    w.add_argument(
        "--exit-with-parent",
        type=positive_int,
        default=None,
        metavar="PID",
        help="end when process PID, this worker's parent, ends (as `hostring crawl --workers N` starts its workers)",
    )
    add_tls_flags(w, server=False)
    w.set_defaults(func=cmd_worker)

    s = sub.add_parser(
        "status",
        help="ring epoch, nodes, owned domains, queue depths, leases in flight",
        description="Ask the coordinator for the ring and every node for its numbers; a table.",
    )
    s.add_argument("--coordinator", type=address_arg, required=True, metavar="ADDR", help="the cluster's coordinator")
    s.add_argument("--json", action="store_true", help="JSON instead of a table")
    s.add_argument("--timeout", type=timeout_s, default=10.0, metavar="S", help="how long to wait for answers")
    add_tls_flags(s, server=False)
    s.set_defaults(func=cmd_status)

    sd = sub.add_parser(
        "seed",
        help="seed a cluster (each URL to the node owning its domain) or a standalone node",
        description="Send start URLs to the nodes owning their registrable domains, or to one standalone node.",
    )
    sd.add_argument("urls", nargs="*", metavar="URL", help="start URLs")
    _node_or_coordinator(sd, "seed")
    sd.add_argument(
        "--seeds-file",
        "--file",
        dest="seeds_file",
        type=nonblank_path,
        metavar="FILE",
        help="more start URLs, one per line",
    )
    sd.add_argument("--timeout", type=timeout_s, default=30.0, metavar="S", help="how long to wait for answers")
    add_tls_flags(sd, server=False)
    sd.set_defaults(func=cmd_seed)

    _add_hosts_commands(sub)
