"""The revisit flags of `hostring crawl` and `hostring node`, the revisit lines of a crawl's summary, and the
`hostring revisit` commands.

Flags (a contract): --revisit {off,fixed,adaptive} --revisit-interval DUR --revisit-min DUR --revisit-max DUR
--revisit-share F --retention DUR, and --duration DUR on `crawl`. A duration is plain seconds or a number with
an s, m, h or d suffix (hostring_cli.args.duration, the one duration parser of the command). Each value is
checked by its parser type, so a bad one given as a flag, a HOSTRING_* variable or a --config entry is refused
by the same words; the checks across flags (min above max, an interval outside them) follow once the settings
are resolved. Either way: one line on stderr naming the flag and the fix, exit status 2, nothing started. Like
every option they are stored in OUT/crawl.toml, so `--resume` continues with the same policy.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from datetime import datetime
from typing import Any

import grpc

from frontier_node.core.config import REVISIT_POLICIES, RevisitConfig, revisit_config_problem
from frontier_node.core.revisit import INTERVAL_BUCKETS, duration_text
from hostring_cli.args import Parser, UsageError, address, positive_duration, timeout_s, utf8


def revisit_policy(text: str) -> str:
    """off, fixed or adaptive (any case)."""
    policy = str(text).strip().lower()
    if policy not in REVISIT_POLICIES:
        raise argparse.ArgumentTypeError(f"unknown policy {text!r}; choose one of {', '.join(REVISIT_POLICIES)}")
    return policy


def share(text: str) -> float:
    """A number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number from 0 to 1 (e.g. 0.5)")
    return value


def parse_duration(text: str, flag: str) -> float:
    """Seconds from "90", "90s", "15m", "6h" or "7d"; a usage error naming `flag` for anything else, zero or
    negative included."""
    try:
        return positive_duration(text)
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"{flag}: {e}") from None


# ---------------------------------------------------------------------------------------------- flags


def revisit_flags(p: argparse.ArgumentParser, *, duration: bool = False) -> None:
    """Add the revisit policy flags (and, for `crawl`, --duration) to a parser."""
    g = p.add_argument_group("revisits (continuous crawling)")
    g.add_argument(
        "--revisit",
        type=revisit_policy,
        default="off",
        metavar="{off,fixed,adaptive}",
        help="fetch pages again: off (one-shot), fixed (every page every --revisit-interval) or adaptive "
        "(each page as often as it is seen to change, within [--revisit-min, --revisit-max])",
    )
    g.add_argument(
        "--revisit-interval",
        type=positive_duration,
        default="1d",
        metavar="DUR",
        help="fixed: the interval; adaptive: the first interval, and the price of a fetch (a page that "
        "changes once per interval is visited once per interval)",
    )
    g.add_argument(
        "--revisit-min", type=positive_duration, default=None, metavar="DUR", help="shortest interval (default: "
        "interval / 10)"
    )  # fmt: skip
    g.add_argument(
        "--revisit-max", type=positive_duration, default=None, metavar="DUR", help="longest interval (default: "
        "interval x 10)"
    )  # fmt: skip
    g.add_argument(
        "--revisit-share",
        type=share,
        default="0.5",
        metavar="F",
        help="part of a host's requests that go to due revisits while new URLs wait too",
    )
    g.add_argument(
        "--retention",
        type=positive_duration,
        default="30d",
        metavar="DUR",
        help="keep pages found gone, and the change history of pages no longer revisited, this long",
    )
    if duration:
        g.add_argument(
            "--duration",
            type=positive_duration,
            default=None,
            metavar="DUR",
            help="stop the crawl cleanly after this long, then report and exit 0 (a continuous crawl never runs "
            "out of work) (default: no limit)",
        )


def revisit_config(args: argparse.Namespace) -> RevisitConfig:
    """The revisit policy from parsed (and resolved) flags; a usage error when the flags disagree."""
    interval: float = args.revisit_interval
    low: float = args.revisit_min if args.revisit_min is not None else interval / 10
    high: float = args.revisit_max if args.revisit_max is not None else interval * 10
    low_text = duration_text(low) + (", interval / 10 by default" if args.revisit_min is None else "")
    high_text = duration_text(high) + (", interval x 10 by default" if args.revisit_max is None else "")
    if low > high:
        raise UsageError(
            f"--revisit-min ({low_text}) is above --revisit-max ({high_text}); "
            "lower --revisit-min or raise --revisit-max"
        )
    if not low <= interval <= high:
        raise UsageError(
            f"--revisit-interval ({duration_text(interval)}) must lie within --revisit-min ({low_text}) "
            f"and --revisit-max ({high_text}); change one of them"
        )
    config = RevisitConfig(args.revisit, interval, low, high, args.revisit_share, args.retention)
    problem = revisit_config_problem(config)
    if problem:  # every case above is checked first; this is a backstop for the core's own rules
        raise UsageError(problem)
    return config


def revisit_node_args(config: RevisitConfig) -> list[str]:
    """The flags that give a node process started by `crawl` the same revisit policy."""
    return [
        "--revisit", config.policy,
        "--revisit-interval", repr(config.interval_s),
        "--revisit-min", repr(config.min_s),
        "--revisit-max", repr(config.max_s),
        "--revisit-share", repr(config.share),
        "--retention", repr(config.retention_s),
    ]  # fmt: skip


def revisit_settings(config: RevisitConfig) -> dict[str, Any]:
    """The revisit policy under its flag names, as OUT/crawl.toml stores it (durations in seconds)."""
    return {
        "revisit": config.policy,
        "revisit-interval": config.interval_s,
        "revisit-min": config.min_s,
        "revisit-max": config.max_s,
        "revisit-share": config.share,
        "retention": config.retention_s,
    }


# ---------------------------------------------------------------------------------------------- the report


def revisit_summary(report: dict[str, Any]) -> list[str]:
    """The revisit lines of a crawl's printed summary (none when the crawl revisited nothing)."""
    r = report.get("revisits")
    if not r:
        return []
    by = r["by_outcome"]
    lines = [
        "  revisits: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in by.items())
        + (f"  (policy {r['policy']})" if "policy" in r else "")
    ]  # fmt: skip
    lag = r.get("lag_s")
    if lag and lag["count"]:
        lines.append(
            f"  revisit lag: mean {lag['mean']:.2f} s, p50 <= {lag.get('p50')} s, p90 <= {lag.get('p90')} s, "
            f"max {lag['max']:.2f} s; due now {r['due_now']}, estimated stale {100 * r['estimated_staleness']:.1f}%"
        )
    spread = r.get("estimated_change_intervals") or {}
    if spread:
        order = {b: i for i, b in enumerate(INTERVAL_BUCKETS)}
        lines.append(
            "  estimated change intervals: "
            + ", ".join(f"{b} {n}" for b, n in sorted(spread.items(), key=lambda kv: order.get(kv[0], 99)))
        )
    return lines


# ---------------------------------------------------------------------------------------------- commands


def _when(at: str | None, after: float | None) -> int:
    """Unix milliseconds from --at (ISO 8601 or Unix seconds) or --in (a duration from now); 0 means now."""
    if at is not None and after is not None:
        raise UsageError("revisit refetch: give --at or --in, not both")
    if after is not None:
        return int((time.time() + after) * 1000)
    if at is None:
        return 0
    try:
        seconds = float(at)
    except ValueError:
        try:
            when = datetime.fromisoformat(at)
        except ValueError:
            raise UsageError(
                f"--at: {at!r} is neither Unix seconds nor an ISO 8601 time (e.g. 2025-01-31T08:00:00+00:00)"
            ) from None
        try:
            seconds = when.timestamp()
        except (ValueError, OverflowError, OSError):  # a local time the platform cannot convert (year 1)
            seconds = math.nan
    if not 0 <= seconds < 253_402_300_800:
        raise UsageError(f"--at: {at!r} is out of range; give a time between 1970 and 9999")
    return int(seconds * 1000)


def cmd_refetch(args: argparse.Namespace) -> int:
    from hostring.security import admin_metadata
    from hostring.v1 import frontier_pb2 as pb
    from hostring.v1 import frontier_pb2_grpc as pb_grpc
    from hostring_cli.cluster import tls_from, token_from
    from hostring_cli.errors import rpc_failure

    at_ms = _when(args.at, args.within)
    try:
        with tls_from(args).channel(args.node) as channel:
            resp = pb_grpc.FrontierStub(channel).Refetch(  # type: ignore[no-untyped-call]
                pb.RefetchRequest(url=args.url, at_ms=at_ms),
                timeout=args.timeout,
                metadata=admin_metadata(token_from(args)),
            )
    except grpc.RpcError as e:
        raise rpc_failure(e, "frontier node", args.node, "--node") from None
    if args.json:
        print(json.dumps({"fetch_key": resp.fetch_key, "state": resp.state, "due_ms": resp.due_ms}, sort_keys=True))
    elif resp.due_ms:
        when = datetime.fromtimestamp(resp.due_ms / 1000).astimezone().isoformat(timespec="seconds")
        print(f"{resp.fetch_key}: fetched again at {when}")
    else:
        print(f"{resp.fetch_key}: already {resp.state}; left as it is")
    return 0


def cmd_revisit_policy(args: argparse.Namespace) -> int:
    from hostring.security import admin_metadata
    from hostring.v1 import frontier_pb2 as pb
    from hostring.v1 import frontier_pb2_grpc as pb_grpc
    from hostring_cli.cluster import tls_from, token_from
    from hostring_cli.errors import rpc_failure

    request = pb.SetHostPolicyRequest(host=args.name.strip().lower().rstrip("."), whole_domain=args.domain)
    request.min_delay_s = -1.0
    if args.revisit is not None:
        request.revisit = args.revisit
    for flag, field in (("interval", "revisit_interval_s"), ("min", "revisit_min_s"), ("max", "revisit_max_s")):
        value = getattr(args, f"revisit_{flag}")
        if value is not None:
            setattr(request, field, value)
    if request.revisit_interval_s:  # as on crawl and node: the bounds default to interval / 10 and x 10
        request.revisit_min_s = request.revisit_min_s or request.revisit_interval_s / 10
        request.revisit_max_s = request.revisit_max_s or request.revisit_interval_s * 10
    if args.revisit_share is not None:
        request.revisit_share = args.revisit_share
    if not (request.revisit or request.revisit_interval_s or request.revisit_min_s or request.revisit_max_s) and (
        args.revisit_share is None
    ):
        raise UsageError("revisit policy: give at least one of --revisit, --revisit-interval, --revisit-min, "
                         "--revisit-max, --revisit-share")  # fmt: skip
    try:
        with tls_from(args).channel(args.node) as channel:
            info = pb_grpc.FrontierStub(channel).SetHostPolicy(  # type: ignore[no-untyped-call]
                request, timeout=args.timeout, metadata=admin_metadata(token_from(args))
            )
    except grpc.RpcError as e:
        raise rpc_failure(e, "frontier node", args.node, "--node") from None
    what = "domain" if args.domain else "host"
    print(f"{what} {request.host}: revisits {info.revisit}" + (f", {info.revisits_due} due now" if info.host else ""))
    return 0


def add_revisit_commands(sub: argparse._SubParsersAction[Parser]) -> None:
    """`hostring revisit refetch URL` and `hostring revisit policy NAME`: administrative calls to one node."""
    from hostring_cli.cluster import add_tls_flags, add_token_flag

    rv = sub.add_parser(
        "revisit",
        help="fetch one page again at a given time, or set a host's or domain's revisit policy",
        description="Steer revisits on a running node (administrative calls: they send the admin token, "
        "$HOSTRING_ADMIN_TOKEN or --admin-token-file).",
    )
    verbs = rv.add_subparsers(dest="revisit_command", required=True, metavar="VERB")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--node", type=address, required=True, metavar="ADDR", help="the frontier node owning the page or host"
        )
        p.add_argument("--timeout", type=timeout_s, default=10.0, metavar="S", help="how long to wait")
        add_tls_flags(p, server=False)
        add_token_flag(p, server=False)

    rf = verbs.add_parser(
        "refetch",
        help="fetch one fetched page again, now or at a given time",
        description="Fetch URL again at --at (ISO 8601 or Unix seconds) or --in (a duration from now); now by "
        "default (as soon as its host's politeness allows).",
    )
    rf.add_argument("url", type=utf8, metavar="URL", help="a fetched page (a URL or its fetch key)")
    rf.add_argument("--at", default=None, metavar="TIME", help="when: ISO 8601 or Unix seconds (default: now)")
    rf.add_argument(
        "--in", dest="within", type=positive_duration, default=None, metavar="DUR", help="when: this long from now"
    )
    rf.add_argument("--json", action="store_true", help="the answer as JSON")
    common(rf)
    rf.set_defaults(func=cmd_refetch)

    pol = verbs.add_parser(
        "policy",
        help="override the revisit policy of a host (or, with --domain, a registrable domain)",
        description="Override NAME's revisit policy; flags not given keep their current value, except that "
        "--revisit-interval alone sets the bounds to interval / 10 and x 10, as on crawl and node. It applies "
        "from each page's next check on.",
    )
    pol.add_argument("name", type=utf8, metavar="NAME", help="a host, or with --domain a registrable domain")
    pol.add_argument("--domain", action="store_true", help="NAME is a registrable domain: all its hosts")
    pol.add_argument("--revisit", type=revisit_policy, default=None, metavar="{off,fixed,adaptive}", help="policy")
    for flag, what in (("interval", "the (first) interval"), ("min", "shortest interval"), ("max", "longest interval")):
        pol.add_argument(f"--revisit-{flag}", type=positive_duration, default=None, metavar="DUR", help=what)
    pol.add_argument("--revisit-share", type=share, default=None, metavar="F", help="part of the host's requests")
    common(pol)
    pol.set_defaults(func=cmd_revisit_policy)
