"""A continuous crawl of about a minute, judged from the server's own log and the WARC files.

The loopback web serves ETag and Last-Modified and answers 304 to conditional requests; on each of two origins
two pages change every few seconds and two never do. `hostring crawl --revisit adaptive --duration 60s` must
end by itself with exit 0, and the server must have seen: the changing pages requested several times as often
as the static ones, the static ones backing off towards the maximum interval, at least 90% of repeat requests
conditional, one request in flight per origin and the delay held throughout. Every 304 must have its WARC
revisit record (server-not-modified) referring to the response record of the stored body.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from fetch_worker.warc import SERVER_NOT_MODIFIED
from frontier_node.offline_report import store_report
from hostring.urls import identify
from hostring_testing import LocalWeb, Site
from hostring_testing.changing import ChangingPage
from hostring_testing.crawls import crawl_cmd, journal, journal_settled, load_report, politeness_violations, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

DURATION_S = 60.0
DELAY_S = 0.25
MAX_S = 24.0
FAST = ("/news1", "/news2")
STATIC = ("/about", "/contact")


def _site(label: str, start: float, offset: float) -> Site:
    pages = {"/": ChangingPage(name=f"{label}/", start=start, links=FAST + STATIC)}
    for i, path in enumerate(FAST):
        pages[path] = ChangingPage(name=label + path, period_s=3.0, start=start + offset + i, links=("/",))
    for path in STATIC:
        pages[path] = ChangingPage(name=label + path, start=start, links=("/",))
    return Site(dict(pages))


@pytest.mark.long(60)
def test_a_continuous_crawl_revisits_by_change_rate_politely_and_conditionally(tmp_path: Path) -> None:
    start = time.time()
    web = LocalWeb({"a": _site("a", start, 0.5), "b": _site("b", start, 1.7)})
    with web:
        out = tmp_path / "out"
        cmd = crawl_cmd(
            [web.url("a", "/"), web.url("b", "/")],
            out,
            delay=DELAY_S,
            scope=None,
            extra=["--revisit", "adaptive", "--revisit-interval", "3s", "--revisit-min", "1s", "--revisit-max",
                   f"{MAX_S:g}s", "--duration", f"{DURATION_S:g}s"],
        )  # fmt: skip
        crawl = run_cli(cmd, out, tmp_path, timeout=DURATION_S + 90)
        assert crawl.proc is not None and crawl.proc.returncode == 0, crawl.output()
        hits = [h for h in web.hits if h.resource != "/robots.txt"]
        settled = journal_settled(out)  # pauses from the earlier of the server's end stamp and the journal's
        violations = {label: politeness_violations(web, label, DELAY_S, settled=settled) for label in ("a", "b")}
        concurrency = {label: web.max_concurrency(label) for label in ("a", "b")}
    assert DURATION_S <= crawl.duration < DURATION_S + 40, crawl.duration
    assert "revisits: " in crawl.stdout()
    report = load_report(out)
    assert report["revisits"]["policy"] == "adaptive"
    # the store alone (hostring report --store) counts the same revisits by outcome, from the journal
    assert store_report(out / "frontier.sqlite3")["revisits"]["by_outcome"] == report["revisits"]["by_outcome"]

    # politeness throughout: one request in flight per origin, the delay between any two
    assert concurrency == {"a": 1, "b": 1}
    assert violations == {"a": [], "b": []}

    per_page: dict[tuple[str, str], list[float]] = defaultdict(list)
    for h in sorted(hits, key=lambda h: h.start):
        per_page[(h.label, h.resource)].append(h.start)
    fast = [len(per_page[(label, p)]) for label in ("a", "b") for p in FAST]
    static = [len(per_page[(label, p)]) for label in ("a", "b") for p in STATIC]
    assert min(static) >= 3, per_page
    assert sum(fast) / len(fast) >= 3 * sum(static) / len(static), (fast, static)
    for label in ("a", "b"):
        for path in STATIC:  # backing off: every gap longer than the one before, the last near the maximum
            times = per_page[(label, path)]
            gaps = [b - a for a, b in itertools.pairwise(times)]
            url = web.url(label, path)  # a failure's message carries the node's account of the page
            assert all(later > earlier for earlier, later in itertools.pairwise(gaps)), (
                path,
                gaps,
                _story(out, url, times[0]),
            )
            assert gaps[-1] >= MAX_S / 2, (path, gaps, _story(out, url, times[0]))

    repeats = [h for h in hits if per_page[(h.label, h.resource)][0] != h.start]
    conditional = sum(h.conditional for h in repeats)
    assert len(repeats) >= 40 and conditional >= 0.9 * len(repeats), (conditional, len(repeats))

    # every 304 has its revisit record, referring to a response record of the same URL
    responses: dict[str, str] = {}
    revisits: Counter[str] = Counter()
    refers: list[tuple[str, str]] = []
    for path in sorted((out / "warc").glob("*.warc.gz*")):
        with path.open("rb") as stream:
            for record in ArchiveIterator(stream):
                uri = record.rec_headers.get_header("WARC-Target-URI")
                if record.rec_type == "response":
                    responses[record.rec_headers.get_header("WARC-Record-ID")] = uri
                elif record.rec_type == "revisit" and record.rec_headers.get_header("WARC-Profile") == (
                    SERVER_NOT_MODIFIED
                ):
                    revisits[uri] += 1
                    refers.append((uri, record.rec_headers.get_header("WARC-Refers-To")))
    not_modified = Counter(web.url(h.label, h.resource) for h in hits if h.status == 304)
    last_gaps = [round(per_page[(lb, p)][-1] - per_page[(lb, p)][-2], 1) for lb in "ab" for p in STATIC]
    print(
        f"\n[revisit e2e] {crawl.duration:.1f} s; requests per changing page {fast}, per static page {static}; "
        f"last gaps of static pages {last_gaps} s; "
        f"repeat requests {len(repeats)}, conditional {conditional} ({100 * conditional / len(repeats):.0f}%); "
        f"304s {sum(not_modified.values())}, server-not-modified records {sum(revisits.values())}"
    )
    assert sum(not_modified.values()) >= 20
    assert revisits == not_modified
    assert all(responses.get(target) == uri for uri, target in refers), refers[:5]


def _story(out: Path, url: str, t0: float) -> list[str]:
    """The journal of one page as lines (event, seconds after `t0`, reason): what the node did with it, for the
    message of a failed assertion about its revisits."""
    return [f"{r['event']} +{r['at'] - t0:.2f}s {r['reason'][:60]}" for r in journal(out, key=identify(url).fetch_key)]
