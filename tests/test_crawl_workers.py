"""`hostring crawl --workers N`: worker child processes share one crawl, judged from the web server's log.

One request in flight per origin and the delay hold whichever worker holds a host; every page is fetched once;
the summary counts every worker's requests; a stop reaches the children (and nothing outlives the crawl); a
child killed mid-crawl loses nothing (its leases run out and another worker fetches what it held). Only loopback
servers that the tests start are contacted.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
from pathlib import Path

import pytest

from hostring_testing import (
    CountingWeb,
    LocalWeb,
    Oracle,
    Site,
    WebModel,
    needed_depth,
    oracle_for,
    random_model,
    render_model,
)
from hostring_testing.crawls import (
    TOKEN,
    CrawlProcess,
    by_state,
    crawl_cmd,
    fresh_page_lease,
    journal,
    load_report,
    page_hits,
    politeness_violations,
    run_cli,
    scope_file,
    unexplained_refetches,
    wait_until,
)
from tests.test_crawl_e2e import crawl_in_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def children_of(crawl_pid: int) -> dict[int, int]:
    """{child number: pid} of the worker children `hostring crawl` process `crawl_pid` runs now."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for arg in args:
            m = re.fullmatch(rb"crawl-(\d+)-(\d+)", arg)
            if m and int(m.group(1)) == crawl_pid and b"worker" in args:
                found[int(m.group(2))] = int(entry.name)
    return found


def _web(seed: int, origins: int, page_s: float) -> tuple[WebModel, dict[str, Site], Oracle]:
    """A generated web (no traps) whose every page takes at least `page_s` to answer."""
    model = random_model(
        seed, origins=origins, pages_per_origin=12, unavailable_robots=0, trap_fraction=0.0, user_agent=TOKEN
    )
    oracle, sites = oracle_for(model), render_model(model, seed)
    for site in sites.values():
        for page in site.pages.values():
            page.delay_s = max(page.delay_s, page_s)
    return model, sites, oracle


def _three_workers(web: CountingWeb, model: WebModel, oracle: Oracle, out: Path, *extra: str) -> list[str]:
    """`hostring crawl --workers 3` of the web's seeds, in scope of its origins, deep enough for the model."""
    return crawl_cmd(
        oracle.seed_urls(web),
        out,
        delay=0.05,
        scope=scope_file(web, out.parent / "scope.txt"),
        extra=["--workers", "3", "--max-depth", str(needed_depth(model) + 4), *extra],
    )


def test_workers_share_a_crawl_politely_and_the_summary_counts_them_all(tmp_path: Path) -> None:
    """Three workers on twelve origins: every reachable allowed page fetched once, nothing robots forbids, one
    request at a time per origin with the delay between; the children fetched too (their own WARC files), the
    summary's request count is the server's, and no child outlives the crawl."""
    model = random_model(7, origins=12, pages_per_origin=15, unavailable_robots=0, user_agent=TOKEN)
    oracle, sites = oracle_for(model), render_model(model, 7)
    out = tmp_path / "crawl"
    with LocalWeb(sites) as web:
        code, report, text = crawl_in_process(
            oracle.seed_urls(web),
            out,
            delay=0.05,
            scope=scope_file(web, tmp_path / "scope.txt"),
            max_depth=needed_depth(model) + 4,
            workers=3,
        )
        assert code == 0, text
        verdict = oracle.judge(web.fetched())
        assert verdict["missing"] == set() and verdict["forbidden"] == set() and verdict["unexpected"] == set()
        assert web.duplicates(include_robots=True) == [], "fetched more than once"
        for label in web.origins:
            assert politeness_violations(web, label, 0.05) == [], f"origin {label}"
        m = re.search(r"this run made (\d+) requests", text)
        assert m is not None, text
        assert int(m.group(1)) == len(web.hits), "the summary counts every worker's requests"
        pages = {(h.label, h.resource) for h in page_hits(web, set(oracle.robots_fetches))}
        assert by_state(report, web, "fetched") == pages

    assert not children_of(os.getpid()), "a worker child outlived the crawl"
    prefixes = {p.name.rsplit("-", 2)[0] for p in (out / "warc").glob("*.warc.gz")}
    assert prefixes == {"hostring", f"hostring-crawl-{os.getpid()}-1", f"hostring-crawl-{os.getpid()}-2"}, prefixes
    children = [json.loads((out / "workers" / f"worker-{i}.json").read_text()) for i in (1, 2)]
    assert all(c["requests"] > 0 for c in children), children


def test_a_stop_reaches_the_workers_and_the_resumed_crawl_fetches_nothing_twice(tmp_path: Path) -> None:
    """SIGTERM to `hostring crawl --workers 3` midway: the fetches in flight (every worker's) finish, the crawl
    exits 130 and no child is left; `--resume` ends the crawl and the server saw no page twice."""
    model, sites, oracle = _web(11, origins=6, page_s=0.15)
    out = tmp_path / "crawl"
    with CountingWeb(sites) as web:
        cmd = _three_workers(web, model, oracle, out)
        first = CrawlProcess(cmd, out, tmp_path, "first").start()
        try:
            wait_until(lambda: len(children_of(first.pid)) == 2 or not first.running, 30, "the worker children")
            wait_until(lambda: len(web.hits) >= 20 or not first.running, 60, "the crawl to be midway")
            assert first.running, first.output()
            kids = children_of(first.pid)
            assert len(kids) == 2, kids
            os.kill(first.pid, signal.SIGTERM)
            code = first.wait(60)
        finally:
            first.kill()
        assert code == 130, first.output()
        assert not any(_alive(pid) for pid in kids.values()), "a worker child outlived the stopped crawl"
        before = len(web.hits)
        assert before < len(oracle.reachable_allowed), "the crawl ended before the stop"

        second = run_cli([*cmd, "--resume"], out, tmp_path, timeout=90, name="resume")
        assert second.proc is not None and second.proc.returncode == 0, second.output()
        verdict = oracle.judge(web.fetched())
        assert verdict["missing"] == set() and verdict["forbidden"] == set() and verdict["unexpected"] == set()
        assert web.duplicates(include_robots=True) == [], "a stop that let the fetches finish refetched something"
        assert journal(out, event="release") == [], "nothing was in flight to hand back"


def test_a_killed_worker_child_loses_nothing(tmp_path: Path) -> None:
    """SIGKILL one worker child midway: the crawl says so and goes on; the child's leases run out (--lease-s 3)
    and other workers fetch what it held; every page ends fetched, and only pages whose lease the journal
    records as expired were fetched twice."""
    model, sites, oracle = _web(13, origins=6, page_s=0.5)
    out = tmp_path / "crawl"
    with CountingWeb(sites) as web:
        cmd = _three_workers(web, model, oracle, out, "--lease-s", "3")
        crawl = CrawlProcess(cmd, out, tmp_path, "crawl").start()
        try:
            victim_id = f"crawl-{crawl.pid}-1"
            wait_until(
                lambda: not crawl.running or _holds_fresh_lease(out, victim_id, web),
                60,
                "worker 1 to hold a fresh lease on a page",
            )
            assert crawl.running, crawl.output()
            victim = children_of(crawl.pid)[1]
            os.kill(victim, signal.SIGKILL)
            code = crawl.wait(120)
        finally:
            crawl.kill()
        assert code == 0, crawl.output()
        assert "worker 1 of 3 ended (killed by SIGKILL" in crawl.stderr(), crawl.output()
        verdict = oracle.judge(web.fetched())
        assert verdict["missing"] == set() and verdict["forbidden"] == set() and verdict["unexpected"] == set()
        expired, unexplained = unexplained_refetches(out, web, ("expire",))
        assert expired, "the killed worker held no lease: nothing was tested"
        assert unexplained == [], f"fetched twice without an expired lease: {unexplained}"
        report = load_report(out)
        assert report["unresolved"]["count"] == 0, report["unresolved"]


def _holds_fresh_lease(out: Path, worker_id: str, web: LocalWeb) -> bool:
    """fresh_page_lease, and False while the crawl's store is not there yet."""
    try:
        return fresh_page_lease(out, worker_id, web)
    except sqlite3.Error:
        return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
