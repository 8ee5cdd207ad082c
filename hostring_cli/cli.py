"""The `hostring` command: one entry point for every process and the tools that inspect them."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import grpc

from frontier_node.core.config import BudgetConfig, FrontierConfig, PolitenessConfig, RetryConfig
from frontier_node.core.robots import RobotsPolicy
from hostring import logs
from hostring_cli.cluster import add_cluster_commands, add_tls_flags, add_token_flag, tls_from, token_from
from hostring_cli.revisit import add_revisit_commands, crawl_duration, revisit_config, revisit_flags, revisit_node_args

if TYPE_CHECKING:
    from hostring_cli.crawl import CrawlOptions

DEFAULT_USER_AGENT = "hostring/0.1 (+https://github.com/hostring/hostring)"
_MAX_REPORT_BYTES = 1 << 30  # a Report with every identity's row outgrows gRPC's 4 MiB default quickly


def _politeness_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("politeness and budgets")
    g.add_argument(
        "--delay",
        type=float,
        default=1.0,
        metavar="S",
        help="minimum seconds between two requests to one host (default: %(default)s)",
    )
    g.add_argument(
        "--concurrency", type=int, default=1, metavar="N", help="requests in flight per host (default: %(default)s)"
    )
    g.add_argument(
        "--user-agent",
        default=DEFAULT_USER_AGENT,
        metavar="UA",
        help="User-Agent sent and whose product token robots.txt groups are matched by",
    )
    g.add_argument("--max-depth", type=int, default=20, metavar="N", help="link depth limit (default: %(default)s)")
    g.add_argument("--max-pages", type=int, default=None, metavar="N", help="stop admitting after N pages")
    g.add_argument(
        "--max-pages-per-host", type=int, default=10_000, metavar="N", help="trap bound per host (default: %(default)s)"
    )
    g.add_argument(
        "--lease-s",
        type=float,
        default=120.0,
        metavar="S",
        help="lease duration before an unfinished fetch is handed out again (default: %(default)s)",
    )
    g.add_argument(
        "--max-attempts",
        type=int,
        default=3,
        metavar="N",
        help="tries of one URL before it fails for good (default: %(default)s)",
    )
    g.add_argument(
        "--retry-base-s",
        type=float,
        default=5.0,
        metavar="S",
        help="first retry delay; it doubles per attempt, with jitter (default: %(default)s)",
    )
    g.add_argument(
        "--robots-attempts",
        type=int,
        default=4,
        metavar="N",
        help="tries of an unavailable robots.txt before its origin is given up (default: %(default)s)",
    )


def frontier_config(args: argparse.Namespace, scope: str = "all") -> FrontierConfig:
    """The core's configuration from parsed politeness flags, with a clear error for nonsense values."""
    if args.delay < 0:
        raise SystemExit("hostring: --delay must be >= 0")
    if args.concurrency < 1:
        raise SystemExit("hostring: --concurrency must be >= 1")
    if args.lease_s <= 0:
        raise SystemExit("hostring: --lease-s must be > 0")
    if args.max_attempts < 1 or args.robots_attempts < 1 or args.retry_base_s < 0:
        raise SystemExit("hostring: --max-attempts and --robots-attempts must be >= 1, --retry-base-s >= 0")
    try:
        RobotsPolicy(args.user_agent)
    except ValueError as e:
        raise SystemExit(f"hostring: --user-agent: {e}") from e
    return FrontierConfig(
        politeness=PolitenessConfig(min_delay_s=args.delay, concurrency=args.concurrency),
        retry=RetryConfig(
            max_attempts=args.max_attempts, base_s=args.retry_base_s, robots_max_attempts=args.robots_attempts
        ),
        budgets=BudgetConfig(
            max_depth=args.max_depth, max_pages_total=args.max_pages, max_pages_per_host=args.max_pages_per_host
        ),
        user_agent=args.user_agent,
        lease_s=args.lease_s,
        scope=scope,
        revisit=revisit_config(args),
    )


def _scope_entries(path: str | None) -> list[str]:
    """Hosts or registrable domains, one per line (# comments), from a scope file."""
    if not path:
        return []
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SystemExit(f"hostring: cannot read scope file {path}: {e.strerror}") from e
    entries = [line.split("#")[0].strip().lower().rstrip(".") for line in text.splitlines()]
    return [e for e in entries if e]


def cmd_node(args: argparse.Namespace) -> int:
    from frontier_node.server import serve_forever, start_node, stop_signals

    if args.scope == "list" and not args.scope_file:
        raise SystemExit("hostring: --scope list needs --scope-file")
    logs.bind(role="node", node=args.id)
    try:
        node = start_node(
            args.store,
            args.listen,
            frontier_config(args, args.scope),
            node_id=args.id,
            scope=_scope_entries(args.scope_file),
            coordinator=args.coordinator,
            advertise=args.advertise,
            weight=args.weight,
            metrics_port=args.metrics_port,
            tls=tls_from(args),
            admin_token=token_from(args),
        )
    except ValueError as e:
        raise SystemExit(f"hostring: {e}") from e
    frontier = node.service.frontier
    logs.set_run_id_getter(lambda: frontier.run_id)
    metrics = f", metrics on port {node.metrics_port}" if node.metrics_port is not None else ""
    done = stop_signals()  # before the announcement: a SIGTERM right after it must still stop cleanly
    print(f"hostring node {args.id} listening on port {node.port} (store {args.store}{metrics})", flush=True)
    serve_forever(node, done)
    return 0


def _crawl_options(args: argparse.Namespace, seeds: list[str], out: str) -> CrawlOptions:
    from pathlib import Path

    from hostring_cli.crawl import CrawlOptions

    scope, scope_file = args.scope, None
    if scope not in ("host", "domain"):
        scope_file = Path(scope)
        if not scope_file.is_file():
            raise SystemExit(f"hostring: --scope must be host, domain or an existing file, not {scope!r}")
        scope = "list"
    config = frontier_config(args)  # validates the politeness and revisit flags
    return CrawlOptions(
        seeds=seeds,
        out=Path(out),
        scope=scope,
        scope_file=scope_file,
        allow_network=args.allow_network,
        delay=args.delay,
        concurrency=args.concurrency,
        max_pages=args.max_pages,
        max_depth=args.max_depth,
        max_pages_per_host=args.max_pages_per_host,
        user_agent=args.user_agent,
        resume=args.resume,
        fetchers=args.fetchers,
        lease_s=args.lease_s,
        progress=not args.no_progress,
        total_timeout_s=args.fetch_timeout,
        max_bytes=args.max_response_bytes,
        metrics_port=args.metrics_port,
        log_format=logs.resolve_format(args.log_format),
        node_args=[
            "--max-attempts",
            str(args.max_attempts),
            "--retry-base-s",
            str(args.retry_base_s),
            "--robots-attempts",
            str(args.robots_attempts),
            *revisit_node_args(config.revisit),
        ],
        duration_s=crawl_duration(args),
    )


def cmd_crawl(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hostring_cli.crawl import CrawlError, read_seeds, run_crawl

    try:
        seeds = read_seeds(args.seeds, Path(args.seeds_file) if args.seeds_file else None)
        if not seeds and not args.resume:
            raise CrawlError("give at least one SEED URL (or --seeds-file, or --resume)")
        return run_crawl(_crawl_options(args, seeds, args.out))
    except CrawlError as e:
        print(f"hostring: {e}", file=sys.stderr)
        return 2


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        from hostring_cli.demo import run_demo
    except ModuleNotFoundError as e:  # an install without the test web (the container image): one line, no traceback
        if (e.name or "").partition(".")[0] != "hostring_testing":
            raise
        print(
            "hostring: demo needs the loopback test web (package hostring_testing), which this install leaves out "
            "(the container image ships no test support); run it from a source checkout: pip install -e .",
            file=sys.stderr,
        )
        return 2
    return run_demo(out=args.out, delay=args.delay)


def cmd_report(args: argparse.Namespace) -> int:
    """The coverage report: live from a node (Report RPC) or reconciled offline from a crawl's SQLite store."""
    from hostring_cli.crawl import summarize

    if args.store:
        from frontier_node.offline_report import StoreReadError, store_path, store_report

        try:
            report = store_report(store_path(args.store), dispositions=args.dispositions)
        except StoreReadError as e:
            raise SystemExit(f"hostring: {e}") from e
    else:
        from hostring.v1 import frontier_pb2 as pb
        from hostring.v1 import frontier_pb2_grpc as pb_grpc

        options = [("grpc.max_receive_message_length", _MAX_REPORT_BYTES)]
        with tls_from(args).channel(args.node, options) as channel:
            resp = pb_grpc.FrontierStub(channel).Report(  # type: ignore[no-untyped-call]
                pb.ReportRequest(dispositions=args.dispositions), timeout=args.timeout
            )
        report = json.loads(resp.json)
    if args.json or args.dispositions:
        json.dump(report, sys.stdout, indent=2, sort_keys=True)
        print()
        return 0
    print(summarize({"suppressed_by_rule": [], **report}))  # an offline report has no budget counters
    if "attempts" in report:
        a = report["attempts"]
        spread = ", ".join(f"{n} lease(s): {c}" for n, c in a["leases_per_identity"].items())
        print(f"  attempts: {spread or 'none'}; leased more than once: {a['leased_more_than_once']}")
        j = report["journal"]
        print(f"  journal: {j['entries']} entries; items disagreeing with their last entry: {j['disagreeing_items']}")
        print(f"  not in the store (ask a live node): {', '.join(report['not_in_store'])}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hostring",
        description="A distributed, polite web-crawl frontier. Run `hostring COMMAND --help` for each command.",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument(
        "--log-format",
        default="auto",
        choices=logs.FORMATS,
        help="text lines, or one JSON object per line (ts, level, logger, msg, run_id, node/worker); "
        "auto: text on a terminal, JSON otherwise (default: %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    node = sub.add_parser(
        "node",
        help="run a frontier node (gRPC Lease/Complete/Discover over a store)",
        description="Serve the Frontier gRPC service over an embedded SQLite (or memory) store.",
    )
    node.add_argument(
        "--store", default="sqlite:///hostring-node.sqlite3", help="sqlite:///PATH or memory:// (default: %(default)s)"
    )
    node.add_argument(
        "--listen",
        default="127.0.0.1:50051",
        metavar="HOST:PORT",
        help="address to serve on; port 0 picks a free one (default: %(default)s)",
    )
    node.add_argument("--id", default="node-0", help="node id (default: %(default)s)")
    node.add_argument(
        "--coordinator", default="", metavar="ADDR", help="join this coordinator's ring (needs a redis:// store)"
    )
    node.add_argument(
        "--advertise",
        default="",
        metavar="HOST:PORT",
        help="address others reach this node at (default: 127.0.0.1 and the bound port)",
    )
    node.add_argument("--weight", type=int, default=1, help="share of the ring (default: %(default)s)")
    node.add_argument("--metrics-port", type=int, default=None, metavar="PORT", help="serve Prometheus /metrics")
    node.add_argument(
        "--scope",
        default="all",
        choices=["all", "host", "domain", "list"],
        help="admit links anywhere, only on the seeds' hosts or registrable domains, or only on the "
        "hosts/domains of --scope-file (default: %(default)s)",
    )
    node.add_argument("--scope-file", metavar="FILE", help="hosts or registrable domains, one per line")
    add_token_flag(node, server=True)
    add_tls_flags(node, server=True)
    _politeness_flags(node)
    revisit_flags(node)
    node.set_defaults(func=cmd_node)

    crawl = sub.add_parser(
        "crawl",
        help="crawl from seeds with a node and a worker on the embedded store, then report",
        description="Run a whole polite crawl in one process tree: a frontier node on SQLite in OUT, a fetch "
        "worker writing WARC to OUT/warc, a live progress line, and a coverage report at the end "
        "(printed and written to OUT/report.json). Ctrl-C stops cleanly; --resume continues.",
    )
    crawl.add_argument("seeds", nargs="*", metavar="SEED", help="start URLs")
    crawl.add_argument("--seeds-file", metavar="F", help="more start URLs, one per line")
    crawl.add_argument(
        "--scope",
        default="domain",
        metavar="host|domain|FILE",
        help="follow links only on the seeds' hosts, their registrable domains, or the hosts and "
        "domains listed in FILE (default: %(default)s)",
    )
    crawl.add_argument(
        "--allow-network",
        action="append",
        default=[],
        metavar="CIDR",
        help="let the fetcher connect to these otherwise refused (loopback, private) addresses; repeatable",
    )
    crawl.add_argument(
        "--out", default="hostring-out", metavar="DIR", help="store, WARC files and report (default: %(default)s)"
    )
    crawl.add_argument("--resume", action="store_true", help="continue the crawl stored in --out")
    crawl.add_argument(
        "--fetchers",
        type=int,
        default=64,
        metavar="N",
        help="fetches in flight at once across hosts (default: %(default)s)",
    )
    crawl.add_argument("--no-progress", action="store_true", help="no live progress line")
    crawl.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the worker's Prometheus /metrics on PORT and the node's on PORT+1",
    )
    crawl.add_argument(
        "--fetch-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="total time one fetch may take, a slow trickle included (default: %(default)s)",
    )
    crawl.add_argument(
        "--max-response-bytes",
        type=int,
        default=10 * 2**20,
        metavar="N",
        help="largest body read, on the wire (default: %(default)s)",
    )
    _politeness_flags(crawl)
    revisit_flags(crawl, duration=True)
    crawl.set_defaults(func=cmd_crawl)

    demo = sub.add_parser(
        "demo",
        help="crawl a small built-in web on loopback to see everything work",
        description="Start a sample web of several origins on 127.0.0.x (robots rules, a "
        "redirect, a crawler trap, mirrors) and crawl it with progress and report.",
    )
    demo.add_argument("--out", default="", metavar="DIR", help="where to keep the crawl (default: a temp dir)")
    demo.add_argument(
        "--delay",
        type=float,
        default=0.2,
        metavar="S",
        help="seconds between requests to one origin (default: %(default)s)",
    )
    demo.set_defaults(func=cmd_demo)

    add_cluster_commands(sub, DEFAULT_USER_AGENT)
    add_revisit_commands(sub)

    report = sub.add_parser(
        "report",
        help="a crawl's coverage report: from a running node, or from a crawl's store",
        description="Reconcile a crawl: final disposition per admitted identity, counts by state and reason, "
        "robots denials, failures, unresolved work. --node asks a running node; --store reads a finished (or "
        "running) crawl's SQLite file read-only and adds the attempts behind each identity from the journal. "
        "A summary by default; --json for the whole report, --dispositions adds every identity's row.",
    )
    source = report.add_mutually_exclusive_group()
    source.add_argument(
        "--node", default="127.0.0.1:50051", metavar="HOST:PORT", help="a running node (default: %(default)s)"
    )
    source.add_argument(
        "--store", metavar="sqlite:///PATH", help="a crawl's store, e.g. sqlite:///OUT/frontier.sqlite3"
    )
    report.add_argument("--json", action="store_true", help="the whole report as JSON instead of a summary")
    report.add_argument(
        "--dispositions",
        action="store_true",
        help="JSON with one row per admitted identity as well (state, reason, attempts; large)",
    )
    report.add_argument("--timeout", type=float, default=30.0)
    add_tls_flags(report, server=False)
    report.set_defaults(func=cmd_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.setup_logging(args.log_level, json=logs.resolve_format(args.log_format) == "json")
    try:
        result: int = args.func(args)
    except grpc.RpcError as e:  # a refused or failed call: one line with the status, not a traceback
        print(f"hostring: {_rpc_failure(e)}", file=sys.stderr)
        return 1
    return result


def _rpc_failure(e: grpc.RpcError) -> str:
    """'CODE: details' of a failed call (grpc.Call errors carry both; a bare RpcError only its text)."""
    code, details = getattr(e, "code", None), getattr(e, "details", None)
    if callable(code) and callable(details):
        return f"{code().name}: {details()}"
    return f"RPC failed: {e}"


if __name__ == "__main__":
    sys.exit(main())
