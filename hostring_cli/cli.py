"""The `hostring` command: one entry point for every process and the tools that inspect them."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frontier_node.core.config import BudgetConfig, FrontierConfig, PolitenessConfig, RetryConfig
from hostring import logs
from hostring.ring import MAX_WEIGHT
from hostring.text import escape_tree
from hostring_cli import errors
from hostring_cli.args import (
    EXIT_CODES,
    MAX_RESPONSE_BYTES,
    Parser,
    UsageError,
    address,
    cidr,
    duration,
    host_port,
    int_at_least,
    is_wildcard,
    listen_address,
    make_dir,
    non_negative_float,
    non_negative_int,
    nonblank_path,
    port,
    positive_float,
    positive_int,
    read_text,
    timeout_s,
    user_agent,
    utf8,
)
from hostring_cli.cluster import add_cluster_commands, add_tls_flags, add_token_flag, tls_from, token_from
from hostring_cli.parent import exit_with_parent
from hostring_cli.revisit import add_revisit_commands, revisit_config, revisit_flags
from hostring_cli.settings import SETTINGS_HELP, Settings, key_of, read_stored, resolve, run_record
from hostring_cli.workers import MAX_WORKERS

if TYPE_CHECKING:
    from hostring_cli.crawl import CrawlOptions

DEFAULT_USER_AGENT = "hostring/0.1 (+https://github.com/hostring/hostring)"
SCOPES = ("all", "host", "domain")
SCOPE_HELP = (
    "all: links anywhere; host, domain: only on the seeds' hosts, or their registrable domains; FILE: only on "
    "the hosts and domains listed in FILE, one per line (the older `--scope list --scope-file FILE` works too)"
)
# Settings of a crawl that belong to one invocation, not to the crawl: not stored in OUT/crawl.toml.
_PER_RUN = frozenset({"resume", "out", "no_progress", "seeds_file", "log_level", "log_format", "config"})


def version() -> str:
    try:
        return metadata.version("hostring")
    except metadata.PackageNotFoundError:
        from hostring import __version__

        return __version__


# ---------------------------------------------------------------------------------------------- shared flags


def _politeness_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("politeness and budgets")
    g.add_argument(
        "--delay",
        type=non_negative_float,
        default=1.0,
        metavar="S",
        help="minimum seconds between two requests to one host",
    )
    g.add_argument("--concurrency", type=positive_int, default=1, metavar="N", help="requests in flight per host")
    g.add_argument(
        "--response-factor",
        type=non_negative_float,
        default=1.0,
        metavar="F",
        help="a slow or failing host also rests F x its recent response time between requests (0: only --delay "
        "and Crawl-delay)",
    )
    g.add_argument(
        "--slow-response",
        type=non_negative_float,
        default=0.5,
        metavar="S",
        help="a host whose recent responses take at least S seconds counts as slow (see --response-factor)",
    )
    g.add_argument(
        "--user-agent",
        type=user_agent,
        default=DEFAULT_USER_AGENT,
        metavar="UA",
        help="User-Agent sent, and whose product token robots.txt groups are matched by",
    )
    g.add_argument("--max-depth", type=non_negative_int, default=20, metavar="N", help="link depth limit")
    g.add_argument(
        "--max-pages", type=positive_int, default=None, metavar="N", help="stop admitting after N pages (default: none)"
    )
    g.add_argument("--max-pages-per-host", type=positive_int, default=10_000, metavar="N", help="trap bound per host")
    g.add_argument(
        "--lease-s",
        type=positive_float,
        default=120.0,
        metavar="S",
        help="lease duration before an unfinished fetch is handed out again",
    )
    g.add_argument(
        "--max-attempts", type=positive_int, default=3, metavar="N", help="tries of one URL before it fails for good"
    )
    g.add_argument(
        "--retry-base-s",
        type=non_negative_float,
        default=5.0,
        metavar="S",
        help="first retry delay; it doubles per attempt, with jitter",
    )
    g.add_argument(
        "--robots-attempts",
        type=positive_int,
        default=4,
        metavar="N",
        help="tries of an unavailable robots.txt before its origin is given up",
    )
    g.add_argument(
        "--max-retry-after",
        type=non_negative_float,
        default=600.0,
        metavar="S",
        help="longest Retry-After honoured (a longer one is cut to this)",
    )


def frontier_config(args: argparse.Namespace, scope: str = "all") -> FrontierConfig:
    """The core's configuration from parsed politeness flags (their ranges are checked by the parser)."""
    return FrontierConfig(
        politeness=PolitenessConfig(
            min_delay_s=args.delay,
            concurrency=args.concurrency,
            retry_after_cap_s=args.max_retry_after,
            response_factor=args.response_factor,
            slow_response_s=args.slow_response,
        ),
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


def scope_setting(scope: str, scope_file: str | None) -> tuple[str, Path | None]:
    """(mode, file) from `--scope all|host|domain|FILE` (or the older `--scope list --scope-file FILE`)."""
    if scope in SCOPES:
        if scope_file:
            raise UsageError(f"--scope-file goes with --scope list (or give --scope {scope_file}), not --scope {scope}")
        return scope, None
    path = Path(scope_file) if scope == "list" and scope_file else None if scope == "list" else Path(scope)
    if path is None:
        raise UsageError("--scope list needs --scope-file FILE (or give --scope FILE)")
    if not scope.strip():
        raise UsageError("--scope is empty; give all, host, domain or a file of hosts")
    if path.is_dir():
        flag = "--scope-file" if scope == "list" else "--scope"
        raise UsageError(f"{flag} {path} is a directory; give all, host, domain or a file of hosts")
    if not path.is_file():
        raise UsageError(f"--scope {scope}: no such file {str(path)!r}; give all, host, domain or a file of hosts")
    return "list", path


def _scope_entries(path: Path | None) -> list[str]:
    """Hosts or registrable domains, one per line (# comments), from a scope file."""
    if path is None:
        return []
    text = read_text(path, "--scope file")
    entries = [line.split("#")[0].strip().lower().rstrip(".") for line in text.splitlines()]
    return [e for e in entries if e]


def _scope_flags(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--scope", default=default, metavar="all|host|domain|FILE", help=SCOPE_HELP)
    p.add_argument(
        "--scope-file", type=nonblank_path, metavar="FILE", help="the older spelling: --scope list --scope-file FILE"
    )


def _global_flags(p: argparse.ArgumentParser, *, top: bool) -> None:
    """--log-level, --log-format and --config: before the command (top) or after it (default: as before it)."""
    g = p.add_argument_group("global options (also accepted before the command)") if not top else p
    default: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    g.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="the least important log records shown; DEBUG also shows the traceback of an unexpected error",
        **({"default": "INFO"} if top else default),
    )
    g.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        help="text lines, or one JSON object per line (ts, level, logger, msg, run_id, node/worker); "
        "auto: text on a terminal, JSON otherwise",
        **({"default": "auto"} if top else default),
    )
    g.add_argument(
        "--config",
        type=nonblank_path,
        metavar="FILE",
        help="a TOML settings file (keys: the long flags without dashes; [COMMAND] tables); or $HOSTRING_CONFIG",
        **default,
    )


# ---------------------------------------------------------------------------------------------- node


def cmd_node(args: argparse.Namespace) -> int:
    if args.exit_with_parent is not None:
        exit_with_parent(args.exit_with_parent)
    from frontier_node.server import serve_forever, start_node, stop_signals
    from frontier_node.store.sqlite import StoreSchemaError

    mode, scope_file = scope_setting(args.scope, args.scope_file)
    config = frontier_config(args, mode)
    advertise = args.advertise
    if args.coordinator:
        if not args.store.startswith(("redis://", "rediss://")):
            raise UsageError("a node in a cluster keeps its state in Redis: give --store redis://HOST:PORT/DB")
        errors.check_redis_url(args.store, "--store")
        if not advertise:
            if is_wildcard(args.listen):
                raise UsageError(
                    f"--listen {args.listen} listens on every interface: give --advertise HOST:PORT, the address "
                    "the coordinator, workers and other nodes reach this node at"
                )
            advertise = args.listen  # a port 0 here is replaced by the port bound (frontier_node.server)
    elif not args.store.startswith(("sqlite:", "memory:")):
        raise UsageError(
            f"--store {args.store!r}: a node on its own keeps its state in sqlite:///PATH (or memory://); "
            "a redis:// store needs --coordinator ADDR"
        )
    logs.bind(role="node", node=args.id)
    try:
        node = start_node(
            args.store,
            args.listen,
            config,
            node_id=args.id,
            scope=_scope_entries(scope_file),
            coordinator=args.coordinator,
            advertise=advertise,
            weight=args.weight,
            metrics_port=args.metrics_port,
            tls=tls_from(args),
            admin_token=token_from(args),
        )
    except errors.redis_errors() as e:
        raise errors.redis_failure(e, args.store, "--store") from None
    except ValueError as e:
        raise UsageError(str(e)) from e
    except StoreSchemaError as e:
        raise UsageError(f"--store {args.store}: {e}") from e
    except OSError as e:
        if e.filename is not None:  # the store's file or directory, not a port
            raise UsageError(f"--store {args.store}: cannot open {e.filename}: {e.strerror}") from e
        raise errors.DependencyError(
            f"cannot start: {e.strerror or e} (--listen {args.listen}, --metrics-port {args.metrics_port}, "
            f"--store {args.store}); free the port or pick another"
        ) from e
    frontier = node.service.frontier
    logs.set_run_id_getter(lambda: frontier.run_id)
    metrics = f", metrics on port {node.metrics_port}" if node.metrics_port is not None else ""
    done = stop_signals()  # before the announcement: a SIGTERM right after it must still stop cleanly
    where = f"scope {mode}" + (f" {scope_file}" if scope_file else "")
    print(f"hostring node {args.id} listening on port {node.port} (store {args.store}, {where}{metrics})", flush=True)
    serve_forever(node, done)
    return 0


# ---------------------------------------------------------------------------------------------- crawl


def cmd_crawl(args: argparse.Namespace) -> int:
    from hostring_cli.crawl import read_seeds, run_crawl
    from hostring_cli.crawldir import CrawlDir

    settings: Settings = args.settings
    stored: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []
    notes: list[str] = []
    crawl_dir = CrawlDir(Path(args.out))
    if args.resume:
        crawl_dir.check(resume=True)
        if crawl_dir.settings.is_file():
            stored, raw = read_stored(crawl_dir.settings, settings.options)
            runs = [dict(r) for r in raw.get("runs", []) if isinstance(r, dict)]
            settings = args.resolve(stored=stored, stored_name=f"stored in {crawl_dir.settings}")
            notes = settings.changes(stored, skip=_PER_RUN)
    seeds_file = Path(args.seeds_file) if args.seeds_file else None
    seeds = read_seeds(args.seeds, seeds_file)
    if not seeds and not args.resume:
        table = settings.config.get("crawl", {})  # seeds = [...] at the top or in the [crawl] table
        listed = settings.config.get("seeds", table.get("seeds", []) if isinstance(table, dict) else [])
        if not isinstance(listed, list):
            raise UsageError(
                f'--config: seeds must be a list of URLs, e.g. seeds = ["https://example.org/"], not {listed!r}'
            )
        seeds = read_seeds([str(s) for s in listed], None)
    if not seeds and not args.resume:
        raise UsageError("give at least one SEED URL (or --seeds-file FILE, or --resume to continue a crawl)")
    opts = _crawl_options(args, seeds, settings, stored)
    opts.runs = [*runs, run_record("resume" if args.resume else "start", notes)]
    if args.resume:
        if stored:
            told = "; ".join(notes) if notes else "no change"
            opts.notice = f"resuming {args.out} with the settings stored in {crawl_dir.settings} ({told})"
        else:
            opts.notice = f"resuming {args.out} (no stored settings: with the flags given and the defaults)"
    return run_crawl(opts)


def _crawl_options(
    args: argparse.Namespace, seeds: list[str], settings: Settings, stored: dict[str, Any]
) -> CrawlOptions:
    from fetch_worker.netpolicy import NetworkPolicy
    from hostring_cli.crawl import CrawlOptions

    mode, scope_file = scope_setting(args.scope, args.scope_file)
    _scope_entries(scope_file)  # read by the crawl's node: refused here, before anything starts, if it cannot be
    config = frontier_config(args)  # for its revisit policy (the parser has checked the user agent)
    try:
        NetworkPolicy(args.allow_network)
    except ValueError as e:
        raise UsageError(f"--allow-network: {e}") from e
    if args.metrics_port == 0:
        raise UsageError(
            "--metrics-port 0: the crawl serves the worker's /metrics on PORT and the node's on PORT+1 (port 1 "
            "here); give a free port, e.g. --metrics-port 9100"
        )
    if args.metrics_port is not None and args.metrics_port + args.workers > 65535:
        last = 65535 - args.workers
        raise UsageError(
            f"--metrics-port {args.metrics_port}: the node serves on the next port and each further worker on the "
            f"ones after it, so at most {last} with --workers {args.workers}"
        )
    reconsider = []
    if args.resume:
        if sorted(args.allow_network) != sorted(stored.get("allow_network", [])):
            reconsider.append("network_policy")
        if stored.get("scope", "domain") != args.scope or stored.get("scope_file") != args.scope_file:
            reconsider.append("out_of_scope")
    record = {
        key_of(settings.options[dest]): value
        for dest, value in settings.values.items()
        if dest in settings.options and dest not in _PER_RUN
    }
    return CrawlOptions(
        seeds=seeds,
        out=Path(args.out),
        scope=mode,
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
        workers=args.workers,
        lease_s=args.lease_s,
        progress=not args.no_progress,
        total_timeout_s=args.fetch_timeout,
        max_bytes=args.max_response_bytes,
        metrics_port=args.metrics_port,
        log_format=logs.resolve_format(args.log_format),
        idle_exit_s=args.idle_exit,
        grace_s=args.grace,
        reconsider=reconsider,
        settings=record,
        node_args=[
            "--max-attempts",
            str(args.max_attempts),
            "--retry-base-s",
            str(args.retry_base_s),
            "--robots-attempts",
            str(args.robots_attempts),
            "--max-retry-after",
            str(args.max_retry_after),
            "--response-factor",
            str(args.response_factor),
            "--slow-response",
            str(args.slow_response),
        ],
        revisit=config.revisit,
        duration_s=args.duration,
    )


# ---------------------------------------------------------------------------------------------- demo, report


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        from hostring_cli.demo import run_demo
    except ModuleNotFoundError as e:  # an install without the test web (the container image): one line, no traceback
        if (e.name or "").partition(".")[0] != "hostring_testing":
            raise
        raise UsageError(
            "demo needs the loopback test web (package hostring_testing), which this install leaves out "
            "(the container image ships no test support); run it from a source checkout: pip install -e ."
        ) from None
    if args.out:
        make_dir(args.out, "--out")
    return run_demo(out=args.out, delay=args.delay)


def cmd_report(args: argparse.Namespace) -> int:
    """The coverage report: live from a node (Report RPC) or reconciled offline from a crawl's SQLite store."""
    from hostring_cli.summary import summarize

    if args.store:
        from frontier_node.offline_report import StoreReadError, store_path, store_report

        try:
            report = store_report(store_path(args.store), dispositions=args.dispositions)
        except StoreReadError as e:
            raise UsageError(f"--store {args.store}: {e}") from e
    else:
        import grpc

        from hostring.v1 import frontier_pb2 as pb
        from hostring.v1 import frontier_pb2_grpc as pb_grpc

        try:  # any size: the report comes in 1 MiB pieces
            with tls_from(args).channel(args.node) as channel:
                chunks = pb_grpc.FrontierStub(channel).ReportStream(  # type: ignore[no-untyped-call]
                    pb.ReportRequest(dispositions=args.dispositions), timeout=args.timeout
                )
                report = json.loads(b"".join(chunk.data for chunk in chunks))
        except grpc.RpcError as e:
            raise errors.rpc_failure(e, "frontier node", args.node, "--node") from None
    if args.json or args.dispositions:
        json.dump(report, sys.stdout, indent=2, sort_keys=True)
        print()
        return 0
    print(summarize(escape_tree(report)))  # what a crawled server chose is escaped for the terminal
    if "attempts" in report:
        a = report["attempts"]
        spread = ", ".join(f"{n} lease(s): {c}" for n, c in a["leases_per_identity"].items())
        print(f"  attempts: {spread or 'none'}; leased more than once: {a['leased_more_than_once']}")
        j = report["journal"]
        print(f"  journal: {j['entries']} entries; items disagreeing with their last entry: {j['disagreeing_items']}")
        if report["not_in_store"]:
            print(f"  not in the store (ask a live node): {', '.join(report['not_in_store'])}")
    return 0


# ---------------------------------------------------------------------------------------------- the parser


def build_parser() -> Parser:
    parser = Parser(
        prog="hostring",
        description="A distributed, polite web-crawl frontier. Run `hostring COMMAND --help` for each command.",
        epilog=f"{SETTINGS_HELP} {EXIT_CODES}",
    )
    parser.add_argument("--version", action="version", version=f"hostring {version()}")
    _global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    node = sub.add_parser(
        "node",
        help="run a frontier node (gRPC Lease/Complete/Discover over a store)",
        description="Serve the Frontier gRPC service over an embedded SQLite (or memory) store, or, with "
        "--coordinator, over Redis as one node of a cluster.",
        epilog=SETTINGS_HELP,
    )
    node.add_argument(
        "--store", default="sqlite:///hostring-node.sqlite3", help="sqlite:///PATH, memory:// or redis://"
    )
    node.add_argument(
        "--listen",
        type=listen_address,
        default="127.0.0.1:50051",
        metavar="HOST:PORT",
        help="address to serve on; port 0 picks",
    )
    node.add_argument("--id", type=utf8, default="node-0", help="node id: its name in the ring")
    node.add_argument(
        "--coordinator", default="", metavar="ADDR", help="join this coordinator's ring (needs a redis:// store)"
    )
    node.add_argument(
        "--advertise",
        type=host_port,
        default=None,
        metavar="HOST:PORT",
        help="address others reach this node at (default: the --listen address; required when it is a wildcard)",
    )
    node.add_argument("--weight", type=int_at_least(1, MAX_WEIGHT), default=1, help="share of the ring")
    node.add_argument("--metrics-port", type=port, default=None, metavar="PORT", help="serve Prometheus /metrics")
    node.add_argument(
        "--exit-with-parent",
        type=positive_int,
        default=None,
        metavar="PID",
        help="end when process PID, this node's parent, ends (as `hostring crawl` starts its node)",
    )
    _scope_flags(node, "all")
    add_token_flag(node, server=True)
    add_tls_flags(node, server=True)
    _politeness_flags(node)
    revisit_flags(node)
    node.set_defaults(func=cmd_node)

    crawl = sub.add_parser(
        "crawl",
        help="crawl from seeds with a node and a worker on the embedded store, then report",
        description="Run a whole polite crawl in one process tree: a frontier node on SQLite in OUT, a fetch "
        "worker writing WARC to OUT/warc, a live progress line, and a coverage report at the end (printed and "
        "written to OUT/report.json). The crawl's settings are kept in OUT/crawl.toml: `--resume --out OUT` "
        "continues with them (a flag given then overrides and is recorded). Ctrl-C (or SIGTERM) lets the fetches "
        "in flight finish and stops; a second Ctrl-C hands them back at once.",
        epilog=f"{_legend()} {SETTINGS_HELP} With --resume, the stored settings come between the file and the "
        f"defaults. {EXIT_CODES}",
    )
    crawl.add_argument("seeds", nargs="*", metavar="SEED", help="start URLs")
    crawl.add_argument("--seeds-file", type=nonblank_path, metavar="FILE", help="more start URLs, one per line")
    _scope_flags(crawl, "domain")
    crawl.add_argument(
        "--allow-network",
        action="append",
        type=cidr,
        default=[],
        metavar="CIDR",
        help="let the fetcher connect to these otherwise refused (loopback, private) addresses; repeatable",
    )
    crawl.add_argument(
        "--out",
        type=nonblank_path,
        default="hostring-out",
        metavar="DIR",
        help="store, settings, WARC files and report",
    )
    crawl.add_argument("--resume", action="store_true", help="continue the crawl in --out, with its stored settings")
    crawl.add_argument("--fetchers", type=positive_int, default=64, metavar="N", help="fetches in flight across hosts")
    crawl.add_argument(
        "--workers",
        type=int_at_least(1, MAX_WORKERS),
        default=1,
        metavar="N",
        help="fetch worker processes: this one and N-1 children, each with --fetchers fetches in flight; more "
        "spread the fetching, parsing and archiving of a crawl of many hosts over more cores (politeness is the "
        "node's: one request in flight per host, whichever worker holds it)",
    )
    crawl.add_argument("--no-progress", action="store_true", help="no live progress line")
    crawl.add_argument(
        "--metrics-port",
        type=port,
        default=None,
        metavar="PORT",
        help="serve the worker's Prometheus /metrics on PORT, the node's on PORT+1 and further workers' on PORT+2, "
        "... (loopback)",
    )
    crawl.add_argument(
        "--fetch-timeout",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="total time one fetch may take, a slow trickle included",
    )
    crawl.add_argument(
        "--max-response-bytes",
        type=positive_int,
        default=MAX_RESPONSE_BYTES,
        metavar="N",
        help="largest body read, on the wire",
    )
    crawl.add_argument(
        "--idle-exit",
        type=duration,
        default="60s",
        metavar="DUR",
        help="end when the only work left cannot start for longer than DUR (a retry after an error, a backed-off "
        "host; at least twice --delay), reporting it as deferred; --resume picks it up; 0 never. Not under "
        "--revisit fixed or adaptive: a continuous crawl always waits for its next revisit, and ends at --duration "
        "or Ctrl-C",
    )
    crawl.add_argument(
        "--grace",
        type=duration,
        default="30s",
        metavar="DUR",
        help="on Ctrl-C or SIGTERM, how long fetches in flight may take to finish before they are handed back",
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
        "--delay", type=non_negative_float, default=0.2, metavar="S", help="seconds between requests to one origin"
    )
    demo.set_defaults(func=cmd_demo)

    add_cluster_commands(sub, DEFAULT_USER_AGENT)
    add_revisit_commands(sub)

    report = sub.add_parser(
        "report",
        help="a crawl's coverage report: from a running node, or from a crawl's store",
        description="Reconcile a crawl: final disposition per admitted identity, counts by state and reason, "
        "robots denials, failures, unresolved work. --node asks a running node (a standalone one, or any node of "
        "a cluster); --store reads a finished (or running) crawl's SQLite file read-only and adds the attempts "
        "behind each identity from the journal. A summary by default; --json for the whole report, "
        "--dispositions adds every identity's row.",
    )
    source = report.add_mutually_exclusive_group()
    source.add_argument("--node", type=address, default="127.0.0.1:50051", metavar="HOST:PORT", help="a running node")
    source.add_argument(
        "--store",
        type=nonblank_path,
        metavar="sqlite:///PATH",
        help="a crawl's store, e.g. sqlite:///OUT/frontier.sqlite3",
    )
    report.add_argument("--json", action="store_true", help="the whole report as JSON instead of a summary")
    report.add_argument(
        "--dispositions",
        action="store_true",
        help="JSON with one row per admitted identity as well (state, reason, attempts; large)",
    )
    report.add_argument("--timeout", type=timeout_s, default=30.0, metavar="S", help="how long to wait for --node")
    add_tls_flags(report, server=False)
    report.set_defaults(func=cmd_report)
    for command in _all_commands(parser):
        _global_flags(command, top=False)
        if command.epilog is None and not command.commands:
            command.epilog = SETTINGS_HELP
    return parser


def _legend() -> str:
    from hostring_cli.progress import LEGEND

    return LEGEND


def _all_commands(parser: Parser) -> list[Parser]:
    out = []
    for sub in parser.commands.values():
        out += [sub, *_all_commands(sub)]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)

    def command() -> int:
        args.resolve = functools.partial(resolve, parser, args, argv, os.environ)
        args.settings = args.resolve()
        logs.setup_logging(args.log_level, json=logs.resolve_format(args.log_format) == "json")
        result: int = args.func(args)
        return result

    return errors.run(command, debug=lambda: getattr(args, "log_level", "") == "DEBUG")


if __name__ == "__main__":
    sys.exit(main())
