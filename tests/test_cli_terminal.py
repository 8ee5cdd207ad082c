"""`hostring crawl` in a terminal, stopped as operators stop it: Ctrl-C once, Ctrl-C twice, SIGTERM, kill -9; each
followed by `hostring crawl --resume --out OUT` with no other flag.

The crawl runs in a pseudo-terminal (pexpect), so Ctrl-C is the terminal's: SIGINT to the foreground process group.
The judge is the loopback web server's own log (hostring_testing.CountingWeb): every page and robots.txt is
fetched completely exactly once over the two runs (a request cut off by a forced stop or kill -9 is logged as
incomplete and fetched again once), and the resumed run uses the stored settings (its User-Agent, its delay, its
network allowlist) though none was repeated.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pexpect
import pytest
from warcio.archiveiterator import ArchiveIterator

from hostring_testing import CountingWeb
from hostring_testing.crawls import (
    LOOPBACK,
    CrawlProcess,
    journal,
    load_report,
    politeness_violations,
    scope_file,
    wait_until,
)
from hostring_testing.pages import Site, html_page
from hostring_testing.proc import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

PAGES = 6
DELAY = 0.3
UA = "stored-ua-test/0.1 (+https://example.invalid/hostring-terminal-tests)"
ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def links(*hrefs: str) -> str:
    return "".join(f'<a href="{h}">{h}</a>' for h in hrefs)


def web_sites() -> dict[str, Site]:
    """One origin: an index linking to PAGES pages, each sent slowly (one byte every 20 ms, about a second), so a
    stop finds a fetch in flight; a client that leaves mid-body shows in the log as an incomplete request."""
    pages = {"/": html_page(links(*[f"/p{i}" for i in range(PAGES)]))}
    for i in range(PAGES):
        pages[f"/p{i}"] = html_page(f"<p>page {i}</p>" + "." * 30, trickle_s=0.02)
    return {"site": Site(pages=pages)}


@pytest.fixture
def web() -> Iterator[CountingWeb]:
    with CountingWeb(web_sites()) as w:
        yield w


@dataclass
class Terminal:
    child: pexpect.spawn  # type: ignore[type-arg]
    started: float

    def text(self) -> str:
        return str(self.child.before or "")


def start_in_terminal(web: CountingWeb, out: Path, tmp: Path) -> Terminal:
    """`hostring crawl` with its settings, in an 80x24 pseudo-terminal."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTRING_")}
    args = [
        "-m", "hostring_cli", "crawl", web.url("site"), "--out", str(out), "--delay", str(DELAY), "--user-agent", UA,
        "--allow-network", LOOPBACK, "--scope", str(scope_file(web, tmp / "scope.txt")), "--grace", "20s",
    ]  # fmt: skip
    child = pexpect.spawn(
        sys.executable, args, cwd=str(REPO), env=env, dimensions=(24, 80), encoding="utf-8", timeout=60
    )
    return Terminal(child, time.monotonic())


def pages_started(web: CountingWeb) -> int:
    return sum(1 for _, resource, _ in list(web.started) if resource.startswith("/p"))


def in_flight(web: CountingWeb) -> bool:
    """A page request has begun and not ended yet (its Hit is logged when it ends)."""
    return pages_started(web) > sum(1 for h in web.hits if h.resource.startswith("/p"))


def wait_for_a_fetch_in_flight(web: CountingWeb, after_pages: int = 2) -> None:
    wait_until(lambda: pages_started(web) > after_pages and in_flight(web), 60, "a page fetch in flight")


def finish(term: Terminal, timeout: float = 60) -> tuple[int, str]:
    term.child.expect(pexpect.EOF, timeout=timeout)
    term.child.close()
    code = term.child.exitstatus if term.child.exitstatus is not None else 128 + (term.child.signalstatus or 0)
    return code, term.text()


def resume(out: Path, tmp: Path) -> CrawlProcess:
    """`hostring crawl --resume --out OUT`, no other flag, to its end."""
    cmd = [sys.executable, "-m", "hostring_cli", "crawl", "--resume", "--out", str(out)]
    proc = CrawlProcess(cmd, out, tmp, "resume").start()
    code = proc.wait(90)  # far less than the 120 s lease a killed run leaves behind
    assert code == 0, proc.output()
    return proc


def judge(web: CountingWeb, out: Path, *, cut_off: int) -> set[str]:
    """Every resource fetched completely exactly once; `cut_off` resources (at most) have one incomplete request
    more, each fetched again; the resumed run used the stored User-Agent, delay and allowlist. Returns the
    resources cut off."""
    hits = web.hits
    complete = Counter(h.resource for h in hits if h.complete)
    expected = {"/robots.txt", "/", *(f"/p{i}" for i in range(PAGES))}
    assert set(complete) == expected, sorted(complete)
    assert [r for r, n in complete.items() if n != 1] == [], complete
    cut = {h.resource for h in hits if not h.complete}
    assert len(cut) <= cut_off, cut
    assert {h.user_agent for h in hits} == {UA}
    assert politeness_violations(web, "site", DELAY) == []
    report = load_report(out)
    assert report["finish"]["reason"] == "drained" and report["unresolved"]["count"] == 0
    assert report["by_state"] == {"fetched": PAGES + 1}
    assert report["discovered_by_verdict"]["admitted"] == report["admitted"] == PAGES + 1
    settings = (out / "crawl.toml").read_text()
    assert settings.count("[[runs]]") == 2 and 'how = "resume"' in settings and "changed = []" in settings
    return cut


def frames(text: str) -> list[str]:
    """What the terminal showed, line by line and redraw by redraw, without escape codes."""
    return [ESCAPES.sub("", part) for line in text.split("\n") for part in line.split("\r") if part.strip()]


def test_ctrl_c_once_finishes_the_fetch_in_flight_then_resume(web: CountingWeb, tmp_path: Path) -> None:
    out = tmp_path / "crawl"
    term = start_in_terminal(web, out, tmp_path)
    wait_for_a_fetch_in_flight(web)
    term.child.sendintr()
    code, text = finish(term)
    assert code == 130, text
    shown = frames(text)
    assert any(f.startswith("stopping: 1 fetch in flight may finish") for f in shown), shown
    assert any(f.startswith("finished: stopped") for f in shown), shown
    progress = [f for f in shown if f.startswith(("fetched ", "queue "))]
    assert progress and all(len(f) < 80 for f in progress), [f for f in progress if len(f) >= 80]
    assert not [h for h in web.hits if not h.complete], "the fetch in flight was cut off"
    before = len(web.hits)
    resume(out, tmp_path)
    assert len(web.hits) > before
    assert judge(web, out, cut_off=0) == set()
    assert not journal(out, event="expire") and not journal(out, event="release")


def test_ctrl_c_twice_hands_the_fetch_in_flight_back_then_resume(web: CountingWeb, tmp_path: Path) -> None:
    out = tmp_path / "crawl"
    term = start_in_terminal(web, out, tmp_path)
    wait_for_a_fetch_in_flight(web)
    term.child.sendintr()
    term.child.expect("press Ctrl-C again")
    term.child.sendintr()
    code, text = finish(term)
    assert code == 130, text
    assert "stopping now: handing the fetches in flight back" in text
    resume(out, tmp_path)
    cut = judge(web, out, cut_off=1)
    assert len(cut) == 1, "the second Ctrl-C did not cut the fetch in flight"
    released = journal(out, event="release")
    assert [(r["key"].rsplit("/", 1)[-1], r["reason"]) for r in released] == [(next(iter(cut))[1:], "worker_shutdown")]
    assert not journal(out, event="expire") and not journal(out, event="retry")


def test_sigterm_stops_like_ctrl_c(web: CountingWeb, tmp_path: Path) -> None:
    out = tmp_path / "crawl"
    term = start_in_terminal(web, out, tmp_path)
    wait_for_a_fetch_in_flight(web)
    term.child.kill(signal.SIGTERM)
    code, text = finish(term)
    assert code == 130, text
    assert not [h for h in web.hits if not h.complete]
    resume(out, tmp_path)
    assert judge(web, out, cut_off=0) == set()


def test_kill_9_then_resume_hands_the_dead_runs_lease_back_at_once(web: CountingWeb, tmp_path: Path) -> None:
    """kill -9 of the crawl while a page is being fetched: its node dies with it (no orphan), the lease is left in
    the store for 120 s; the resumed run hands it back at once (journal: release worker_gone, no expiry) and the
    page is fetched again, once."""
    out = tmp_path / "crawl"
    term = start_in_terminal(web, out, tmp_path)
    wait_for_a_fetch_in_flight(web)
    node_pids = _children(term.child.pid)
    term.child.kill(signal.SIGKILL)
    finish(term)
    wait_until(lambda: not any(_alive(p) for p in node_pids), 10, "the node to die with the crawl")
    assert list((out / "warc").glob("*.warc.gz.open")), "the killed worker left no unfinished WARC file"
    resume(out, tmp_path)
    cut = judge(web, out, cut_off=1)
    assert len(cut) == 1, "kill -9 did not cut the fetch in flight"
    released = journal(out, event="release")
    assert len(released) == 1 and released[0]["reason"] == "worker_gone", released
    assert released[0]["key"].endswith(next(iter(cut)))
    assert not journal(out, event="expire")
    # The resumed run finished the killed run's WARC file: none is left .open, and all read back whole.
    assert not list((out / "warc").glob("*.open"))
    responses = []
    for path in sorted((out / "warc").glob("*.warc.gz")):
        with path.open("rb") as stream:
            responses += [
                r.rec_headers.get_header("WARC-Target-URI") for r in ArchiveIterator(stream) if r.rec_type == "response"
            ]
    assert sorted(u.rsplit("/", 1)[-1] for u in responses) == sorted(
        ["", "robots.txt", *(f"p{i}" for i in range(PAGES))]
    )


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status
