"""The revisit flags of `hostring crawl` and `hostring node`, durations, and the `hostring revisit` commands.

Flags (a contract): --revisit {off,fixed,adaptive} --revisit-interval DUR --revisit-min DUR --revisit-max DUR
--revisit-share F --retention DUR, and --duration DUR on `crawl`. A duration is plain seconds or a number with
an s, m, h or d suffix. Bad values stop the command before anything starts, with one line on stderr naming the
flag and the fix, and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from datetime import datetime
from typing import Any, NoReturn

from frontier_node.core.config import REVISIT_POLICIES, RevisitConfig, revisit_config_problem
from frontier_node.core.revisit import INTERVAL_BUCKETS, duration_text

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
_DURATION_HINT = "give seconds or a number with s, m, h or d, e.g. 90, 90s, 15m, 6h or 7d"


def bad_input(message: str) -> NoReturn:
    """One line on stderr and exit status 2: what command-line input errors end with."""
    print(f"hostring: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse_duration(text: str, flag: str) -> float:
    """Seconds from "90", "90s", "15m", "6h" or "7d"; a one-line error naming `flag` for anything else, zero
    or negative included."""
    m = _DURATION.match(text)
    if m is None:
        stripped = text.strip()
        if stripped.startswith("-") or stripped in ("0", "0s"):
            bad_input(f"{flag}: {text!r} is not a positive duration; {_DURATION_HINT}")
        bad_input(f"{flag}: {text!r} is not a duration; {_DURATION_HINT}")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not seconds > 0 or not math.isfinite(seconds):
        bad_input(f"{flag}: {text!r} is not a positive duration; {_DURATION_HINT}")
    return seconds


# ---------------------------------------------------------------------------------------------- flags


def revisit_flags(p: argparse.ArgumentParser, *, duration: bool = False) -> None:
    """Add the revisit policy flags (and, for `crawl`, --duration) to a parser."""
    g = p.add_argument_group("revisits (continuous crawling)")
    g.add_argument(
        "--revisit",
        default="off",
        metavar="{off,fixed,adaptive}",
        help="fetch pages again: off (one-shot), fixed (every page every --revisit-interval) or adaptive "
        "(each page as often as it is seen to change, within [--revisit-min, --revisit-max]) (default: off)",
    )
    g.add_argument(
        "--revisit-interval",
        default="1d",
        metavar="DUR",
        help="fixed: the interval; adaptive: the first interval, and the price of a fetch (a page that "
        "changes once per interval is visited once per interval) (default: %(default)s)",
    )
    g.add_argument("--revisit-min", default=None, metavar="DUR", help="shortest interval (default: interval / 10)")
    g.add_argument("--revisit-max", default=None, metavar="DUR", help="longest interval (default: interval x 10)")
    g.add_argument(
        "--revisit-share",
        default="0.5",
        metavar="F",
        help="part of a host's requests that go to due revisits while new URLs wait too (default: %(default)s)",
    )
    g.add_argument(
        "--retention",
        default="30d",
        metavar="DUR",
        help="keep pages found gone, and the change history of pages no longer revisited, this long "
        "(default: %(default)s)",
    )
    if duration:
        g.add_argument(
            "--duration",
            default=None,
            metavar="DUR",
            help="stop the crawl cleanly after this long, then report (a continuous crawl never runs out of work)",
        )


def revisit_config(args: argparse.Namespace) -> RevisitConfig:
    """The revisit policy from parsed flags; a one-line error (exit 2) for a bad value."""
    policy = str(args.revisit).strip().lower()
    if policy not in REVISIT_POLICIES:
        bad_input(f"--revisit: unknown policy {args.revisit!r}; choose one of {', '.join(REVISIT_POLICIES)}")
    interval = parse_duration(args.revisit_interval, "--revisit-interval")
    low = parse_duration(args.revisit_min, "--revisit-min") if args.revisit_min is not None else interval / 10
    high = parse_duration(args.revisit_max, "--revisit-max") if args.revisit_max is not None else interval * 10
    if low > high:
        bad_input(
            f"--revisit-min ({duration_text(low)}) is above --revisit-max ({duration_text(high)}); "
            "lower --revisit-min or raise --revisit-max"
        )
    if not low <= interval <= high:
        bad_input(
            f"--revisit-interval ({duration_text(interval)}) must lie within --revisit-min ({duration_text(low)}) "
            f"and --revisit-max ({duration_text(high)}); change one of them"
        )
    try:
        share = float(args.revisit_share)
    except ValueError:
        share = math.nan
    if not 0.0 <= share <= 1.0:
        bad_input(f"--revisit-share: {args.revisit_share!r} is not a number from 0 to 1 (e.g. 0.5)")
    retention = parse_duration(args.retention, "--retention")
    config = RevisitConfig(policy, interval, low, high, share, retention)
    problem = revisit_config_problem(config)
    if problem:  # every case above is checked first; this is a backstop for the core's own rules
        bad_input(problem)
    return config


def crawl_duration(args: argparse.Namespace) -> float | None:
    """--duration in seconds, or None when not given."""
    return None if args.duration is None else parse_duration(args.duration, "--duration")


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


def _when(at: str | None, after: str | None) -> int:
    """Unix milliseconds from --at (ISO 8601 or Unix seconds) or --in (a duration from now); 0 means now."""
    if at is not None and after is not None:
        bad_input("refetch: give --at or --in, not both")
    if after is not None:
        return int((time.time() + parse_duration(after, "--in")) * 1000)
    if at is None:
        return 0
    try:
        return int(float(at) * 1000)
    except ValueError:
        pass
    try:
        return int(datetime.fromisoformat(at).timestamp() * 1000)
    except ValueError:
        bad_input(f"--at: {at!r} is neither Unix seconds nor an ISO 8601 time (e.g. 2025-01-31T08:00:00+00:00)")


def cmd_refetch(args: argparse.Namespace) -> int:
    from hostring.security import admin_metadata
    from hostring.v1 import frontier_pb2 as pb
    from hostring.v1 import frontier_pb2_grpc as pb_grpc
    from hostring_cli.cluster import tls_from, token_from

    at_ms = _when(args.at, args.within)
    with tls_from(args).channel(args.node) as channel:
        resp = pb_grpc.FrontierStub(channel).Refetch(  # type: ignore[no-untyped-call]
            pb.RefetchRequest(url=args.url, at_ms=at_ms),
            timeout=args.timeout,
            metadata=admin_metadata(token_from(args)),
        )
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

    request = pb.SetHostPolicyRequest(host=args.name.strip().lower().rstrip("."), whole_domain=args.domain)
    request.min_delay_s = -1.0
    if args.revisit is not None:
        policy = args.revisit.strip().lower()
        if policy not in REVISIT_POLICIES:
            bad_input(f"--revisit: unknown policy {args.revisit!r}; choose one of {', '.join(REVISIT_POLICIES)}")
        request.revisit = policy
    for flag, field in (("interval", "revisit_interval_s"), ("min", "revisit_min_s"), ("max", "revisit_max_s")):
        value = getattr(args, f"revisit_{flag}")
        if value is not None:
            setattr(request, field, parse_duration(value, f"--revisit-{flag}"))
    if request.revisit_interval_s:  # as on crawl and node: the bounds default to interval / 10 and x 10
        request.revisit_min_s = request.revisit_min_s or request.revisit_interval_s / 10
        request.revisit_max_s = request.revisit_max_s or request.revisit_interval_s * 10
    if args.revisit_share is not None:
        try:
            share = float(args.revisit_share)
        except ValueError:
            share = math.nan
        if not 0.0 <= share <= 1.0:
            bad_input(f"--revisit-share: {args.revisit_share!r} is not a number from 0 to 1 (e.g. 0.5)")
        request.revisit_share = share
    if not (request.revisit or request.revisit_interval_s or request.revisit_min_s or request.revisit_max_s) and (
        args.revisit_share is None
    ):
        bad_input("revisit policy: give at least one of --revisit, --revisit-interval, --revisit-min, "
                  "--revisit-max, --revisit-share")  # fmt: skip
    with tls_from(args).channel(args.node) as channel:
        info = pb_grpc.FrontierStub(channel).SetHostPolicy(  # type: ignore[no-untyped-call]
            request, timeout=args.timeout, metadata=admin_metadata(token_from(args))
        )
    what = "domain" if args.domain else "host"
    print(f"{what} {request.host}: revisits {info.revisit}" + (f", {info.revisits_due} due now" if info.host else ""))
    return 0


def add_revisit_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`hostring revisit refetch URL` and `hostring revisit policy HOST`: administrative calls to one node."""
    from hostring_cli.cluster import add_tls_flags, add_token_flag

    rv = sub.add_parser(
        "revisit",
        help="fetch one page again at a given time, or set a host's or domain's revisit policy",
        description="Steer revisits on a running node (administrative calls: they send the admin token, "
        "$HOSTRING_ADMIN_TOKEN or --admin-token-file).",
    )
    verbs = rv.add_subparsers(dest="revisit_command", required=True, metavar="VERB")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--node", required=True, metavar="ADDR", help="the frontier node owning the page or host")
        p.add_argument("--timeout", type=float, default=10.0, metavar="S")
        add_tls_flags(p, server=False)
        add_token_flag(p, server=False)

    rf = verbs.add_parser(
        "refetch",
        help="fetch one fetched page again, now or at a given time",
        description="Fetch URL again at --at (ISO 8601 or Unix seconds) or --in (a duration from now); now by "
        "default (as soon as its host's politeness allows).",
    )
    rf.add_argument("url", metavar="URL")
    rf.add_argument("--at", default=None, metavar="TIME")
    rf.add_argument("--in", dest="within", default=None, metavar="DUR")
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
    pol.add_argument("name", metavar="NAME", help="a host, or with --domain a registrable domain")
    pol.add_argument("--domain", action="store_true", help="NAME is a registrable domain: all its hosts")
    pol.add_argument("--revisit", default=None, metavar="{off,fixed,adaptive}")
    pol.add_argument("--revisit-interval", default=None, metavar="DUR")
    pol.add_argument("--revisit-min", default=None, metavar="DUR")
    pol.add_argument("--revisit-max", default=None, metavar="DUR")
    pol.add_argument("--revisit-share", default=None, metavar="F")
    common(pol)
    pol.set_defaults(func=cmd_revisit_policy)
