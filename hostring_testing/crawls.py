"""Run `hostring crawl` and other `hostring` commands as processes, read what they wrote, judge the server's log.

The judge is always the web server (`LocalWeb.hits`): what a crawler claims in its report is compared with
what the server saw, never the other way round.
"""

from __future__ import annotations

import itertools
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hostring.urls import ROBOTS_PREFIX, identify
from hostring_testing.identity import canonical_target
from hostring_testing.pages import Key
from hostring_testing.proc import PORT_LINE, REPO, GroupProcess, hostring_cmd
from hostring_testing.server import Hit, LocalWeb

__all__ = [
    "GAP_TOLERANCE_S",
    "LOOPBACK",
    "REPO",
    "STORE_NAME",
    "TOKEN",
    "UA",
    "CrawlProcess",
    "by_state",
    "crawl_cmd",
    "dispositions",
    "fresh_page_lease",
    "gaps",
    "held_by",
    "hostring_cmd",
    "is_robots",
    "journal",
    "journal_settled",
    "key_of",
    "load_report",
    "page_hits",
    "politeness_violations",
    "run_cli",
    "scope_file",
    "serve",
    "settled_at",
    "settled_by",
    "unexplained_refetches",
    "wait_until",
]

START_TIMEOUT_S = 30.0
STORE_NAME = "frontier.sqlite3"

# The product token must be letters, '_' and '-' only (RFC 9309 §2.2.1): no digits.
TOKEN = "hostring-test"
UA = f"{TOKEN}/0.1 (+https://example.invalid/hostring-e2e-tests)"
LOOPBACK = "127.0.0.0/8"

# Slack for comparing the server's clock readings with a configured delay: the server stamps a hit's end
# after its last write and the next start after parsing a request head, both on one event loop thread.
GAP_TOLERANCE_S = 0.02


# ------------------------------------------------------------------------------------------------ commands


def crawl_cmd(
    seeds: Sequence[str],
    out: Path,
    *,
    delay: float,
    allow: Sequence[str] = (LOOPBACK,),
    scope: str | Path | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """`hostring crawl` as a subprocess command line (always --no-progress, our User-Agent)."""
    cmd = [
        sys.executable,
        "-m",
        "hostring_cli",
        "crawl",
        *seeds,
        "--out",
        str(out),
        "--no-progress",
        "--delay",
        str(delay),
        "--user-agent",
        UA,
    ]
    for cidr in allow:
        cmd += ["--allow-network", cidr]
    if scope is not None:
        cmd += ["--scope", str(scope)]
    return cmd + list(extra)


def scope_file(web: LocalWeb, path: Path, labels: Iterable[str] | None = None) -> Path:
    """A --scope FILE naming the hosts of `labels` (default: every origin of the web)."""
    hosts = sorted({web.addresses[label][0] for label in (labels if labels is not None else web.origins)})
    path.write_text("\n".join(hosts) + "\n", encoding="utf-8")
    return path


class CrawlProcess(GroupProcess):
    """A `hostring crawl` (or other hostring command) in its own session, so the whole tree can be killed.

    It inherits this process's environment as it is when started (a test's HOSTRING_ADMIN_TOKEN included).
    """

    inherit_env = True

    def __init__(self, cmd: list[str], out: Path | None, log_dir: Path, name: str = "crawl") -> None:
        super().__init__(name, cmd, log_dir, cwd=REPO, start=False)
        self.out = out
        self.ended = 0.0

    def wait(self, timeout: float) -> int:
        """The exit code; on timeout the whole process group is killed and AssertionError says so."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not end within {timeout}s\n{self.output()}") from None
        self.ended = time.monotonic()
        self._close()
        return code

    @property
    def duration(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def kill(self) -> None:
        """SIGKILL the whole process group (the crawl and its node child), and reap the leader."""
        if self.proc is None:
            return
        self.stop(signal.SIGKILL)
        self.ended = self.ended or time.monotonic()

    def output(self) -> str:
        node_log = ""
        if self.out is not None and (self.out / "node.log").exists():
            node_log = (self.out / "node.log").read_text(encoding="utf-8", errors="replace")[-3000:]
        return (
            f"--- {self.name} stdout\n{self.stdout()[-4000:]}\n--- stderr\n{self.stderr()[-4000:]}"
            f"\n--- node.log\n{node_log}"
        )


def run_cli(cmd: list[str], out: Path | None, log_dir: Path, timeout: float, name: str = "crawl") -> CrawlProcess:
    """Run a hostring command to its end (bounded); the finished CrawlProcess (check `.proc.returncode`)."""
    proc = CrawlProcess(cmd, out, log_dir, name).start()
    proc.wait(timeout)
    return proc


# ------------------------------------------------------------------------------------------------ reading


def load_report(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((out / "report.json").read_text(encoding="utf-8"))
    return report


def journal(out: Path, *, event: str | None = None, key: str | None = None) -> list[dict[str, Any]]:
    """Journal rows of a crawl's store (read-only), optionally one event and/or one fetch key."""
    con = sqlite3.connect(f"file:{out / STORE_NAME}?mode=ro", uri=True, timeout=10)
    con.row_factory = sqlite3.Row
    try:
        sql, args = "SELECT * FROM journal WHERE 1=1", list[str]()
        if event is not None:
            sql, args = sql + " AND event = ?", [*args, event]
        if key is not None:
            sql, args = sql + " AND key = ?", [*args, key]
        return [dict(r) for r in con.execute(sql + " ORDER BY seq", args)]
    finally:
        con.close()


def held_by(out: Path, worker_id: str) -> dict[str, float]:
    """Keys the node's journal shows leased to `worker_id` and not settled since, with when each was granted."""
    holder: dict[str, tuple[str, float]] = {}
    for row in journal(out):
        if row["event"] == "lease":
            holder[row["key"]] = (row["reason"], row["at"])
        elif row["event"] in ("complete", "retry", "fail", "expire", "redirect", "reschedule", "release"):
            holder.pop(row["key"], None)
    return {key: at for key, (who, at) in holder.items() if who == worker_id}


def fresh_page_lease(out: Path, worker_id: str, web: LocalWeb) -> bool:
    """Whether `worker_id` holds a lease on a page `web` answers slowly (its `delay_s`), granted in the last
    0.15 s, counted from after the journal was read (a slow read must not age the lease unseen). On a test page
    that takes 0.5 s to answer, such a lease cannot be completed in the moment before a kill; a lease seen at any
    age might be (its completion on the wire, or not yet in the journal), and so might a lease on a link the web
    answers at once (a 404)."""
    held = held_by(out, worker_id)
    since = time.time() - 0.15
    return any(
        at >= since and _answers_slowly(web, key) for key, at in held.items() if not key.startswith(ROBOTS_PREFIX)
    )


def _answers_slowly(web: LocalWeb, url: str) -> bool:
    """Whether `web` waits before answering the page `url` names."""
    page, _ = web.page(*key_of(web, url))
    return page.delay_s > 0


def key_of(web: LocalWeb, url: str) -> Key:
    """The server's (label, resource) identity of an absolute URL from a report."""
    p = urlsplit(url)
    origin = f"{p.scheme}://{p.netloc}"
    target = (p.path or "/") + ("?" + p.query if p.query else "")
    return web.labels[origin], canonical_target(target)


def unexplained_refetches(out: Path, web: LocalWeb, events: Sequence[str]) -> tuple[dict[Key, int], list[Any]]:
    """How often the journal records each resource's lease as `events` (expire, release: what explains a second
    fetch), by the server's identity; and the server's repeated fetches those do not explain, (label, resource,
    times)."""
    explained: dict[Key, int] = {}
    for event in events:
        for row in journal(out, event=event):
            key = row["key"]
            k = (
                (web.labels[key.removeprefix(ROBOTS_PREFIX)], "/robots.txt")
                if key.startswith(ROBOTS_PREFIX)
                else key_of(web, key)
            )
            explained[k] = explained.get(k, 0) + 1
    twice = web.duplicates(include_robots=True)
    return explained, [(web.labels[o], r, n) for o, r, n in twice if n - 1 > explained.get((web.labels[o], r), 0)]


def dispositions(report: dict[str, Any], web: LocalWeb) -> dict[Key, dict[str, Any]]:
    """Report rows (page items) keyed by the server's identity of their URL."""
    return {key_of(web, row["url"]): row for row in report["dispositions"]}


def by_state(report: dict[str, Any], web: LocalWeb, state: str) -> set[Key]:
    return {key for key, row in dispositions(report, web).items() if row["state"] == state}


# ------------------------------------------------------------------------------------------------ judging


def is_robots(hit: Hit, robots_files: set[Key] = frozenset()) -> bool:  # type: ignore[assignment]
    return hit.resource == "/robots.txt" or (hit.label, hit.resource) in robots_files


def page_hits(web: LocalWeb, robots_files: set[Key] = frozenset()) -> list[Hit]:  # type: ignore[assignment]
    """Requests for pages: robots.txt and the given robots redirect targets left out."""
    return [h for h in web.hits if not is_robots(h, robots_files)]


def gaps(hits: Sequence[Hit]) -> list[tuple[float, Hit, Hit]]:
    """(pause from the latest earlier end to this start, previous, this) for hits of one origin by start."""
    ordered = sorted(hits, key=lambda h: h.start)
    out: list[tuple[float, Hit, Hit]] = []
    latest: Hit | None = None
    for prev, cur in itertools.pairwise(ordered):
        if latest is None or prev.end > latest.end:
            latest = prev
        out.append((cur.start - latest.end, latest, cur))
    return out


def short_pauses(
    hits: Sequence[Hit], delay: float, tolerance: float, settled: Callable[[Hit], float | None] | None = None
) -> list[tuple[float, Hit, Hit]]:
    """The gaps() of one origin's hits that fall short of `delay` (less `tolerance`).

    `settled(hit)`, when given, is when a node journaled the end of the fetch that hit served: the response ended
    no later than that, so a pause counts from the earlier of it and the server's end stamp (a server thread
    descheduled between writing a response and stamping its end makes the next pause look short). Both are upper
    bounds of the true end: the pause is never made to look longer than it was."""
    out = []
    for gap, prev, cur in gaps(hits):
        if gap < delay - tolerance:
            done = settled(prev) if settled is not None else None
            if done is not None and cur.start - min(prev.end, done) >= delay - tolerance:
                continue
            out.append((gap, prev, cur))
    return out


def settled_at(lines: dict[str, list[dict[str, Any]]], key: str, start: float) -> float | None:
    """When a node journaled the end of the fetch of `key` that a request starting at `start` served: the first
    settling of a lease (complete, retry, release...; not an expiry, which says nothing of the response) after it."""
    for e in lines.get(key, []):
        if e["at"] >= start - 0.05 and e["from"] == "leased" and e["event"] != "expire":
            return float(e["at"])
    return None


def settled_by(lines: dict[str, list[dict[str, Any]]]) -> Callable[[Hit], float | None]:
    """settled(hit) for politeness_violations over journal lines by fetch key (event, from, at): when a node
    journaled the end of the fetch that hit served (None for robots.txt: its key is not the page's URL)."""

    def settled(hit: Hit) -> float | None:
        return settled_at(lines, identify(hit.origin + hit.path).fetch_key, hit.start)

    return settled


def journal_settled(out: Path) -> Callable[[Hit], float | None]:
    """settled_by() over the journal of a one-node crawl's store."""
    lines: dict[str, list[dict[str, Any]]] = {}
    for row in journal(out):
        lines.setdefault(row["key"], []).append({"event": row["event"], "from": row["from_state"], "at": row["at"]})
    return settled_by(lines)


def politeness_violations(
    web: LocalWeb,
    label: str,
    delay: float,
    tolerance: float = GAP_TOLERANCE_S,
    settled: Callable[[Hit], float | None] | None = None,
) -> list[str]:
    """Human lines for every overlap or short pause on one origin, judged from the server's timestamps (and, given
    `settled`, the journal: see short_pauses)."""
    hits = web.hits_for(label)
    bad = [f"{h.path} started with {h.concurrent} requests in flight" for h in hits if h.concurrent > 1]
    bad += [
        f"{cur.path} started {gap:.3f}s after {prev.path} ended (delay {delay}s)"
        for gap, prev, cur in short_pauses(hits, delay, tolerance, settled)
    ]
    return bad


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll `predicate` until it holds; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def serve(args: Sequence[str], log_dir: Path, name: str) -> tuple[CrawlProcess, int]:
    """Start a long-running `hostring` process (its own process group) and wait for its "listening on port" line."""
    proc = CrawlProcess(hostring_cmd(*args), None, log_dir, name).start()
    try:
        wait_until(
            lambda: PORT_LINE.search(proc.stdout()) is not None or not proc.running,
            START_TIMEOUT_S,
            f"{name} to listen",
        )
        m = PORT_LINE.search(proc.stdout())
        assert m is not None, f"{name} did not start:\n{proc.output()}"
    except BaseException:
        proc.kill()
        raise
    return proc, int(m.group(1))
