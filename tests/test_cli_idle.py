"""A crawl whose only work waits on a robots.txt that answers 503 with Retry-After: 3600 does not sit there: the
live line says what it waits for and until when, the crawl ends after --idle-exit with the waiting URLs reported
as deferred (reason and earliest time), and a later --resume, once the server answers, fetches them.

The Retry-After is honoured up to --max-retry-after (4 s here, so that the test can wait it out).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

import pexpect
import pytest

from hostring_testing import CountingWeb
from hostring_testing.crawls import LOOPBACK, CrawlProcess, load_report
from hostring_testing.pages import Page, Site, html_page
from hostring_testing.proc import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

UA = "idle-test/0.1 (+https://example.invalid/hostring-idle-tests)"


def sites() -> dict[str, Site]:
    busy = Page(status=503, body=b"busy\n", content_type="text/plain", headers={"Retry-After": "3600"})
    return {
        "down": Site(
            pages={"/": html_page('<a href="/a">a</a>'), "/a": html_page('<a href="/">home</a>')},
            robots=busy,
        )
    }


def test_idle_exit_reports_deferred_urls_and_resume_fetches_them(tmp_path: Path) -> None:
    out = tmp_path / "crawl"
    with CountingWeb(sites()) as web:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTRING_")}
        args = [
            "-m", "hostring_cli", "crawl", web.url("down"), "--out", str(out), "--allow-network", LOOPBACK,
            "--user-agent", UA, "--delay", "0.05", "--idle-exit", "1s", "--max-retry-after", "4",
            "--retry-base-s", "0.5",
        ]  # fmt: skip
        term = pexpect.spawn(sys.executable, args, cwd=str(REPO), env=env, dimensions=(24, 80), encoding="utf-8")
        term.expect(pexpect.EOF, timeout=60)
        term.close()
        ended = time.time()
        text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", str(term.before))
        assert term.exitstatus == 3, text  # nothing fetchable: not one page was fetched
        assert re.search(
            r"queue 1  waiting until \d\d:\d\d:\d\d: robots\.txt of 127\.0\.0\.\d+:\d+ \(robots_503\)", text
        ), text
        assert "finished: idle" in text and "deferred: 1 URLs wait longer than --idle-exit 1s" in text, text
        assert f"hostring crawl --resume --out {out}" in text

        report = load_report(out)
        finish = report["finish"]
        assert finish["reason"] == "idle" and finish["exit_code"] == 3
        (deferred,) = finish["deferred"]
        assert deferred["url"] == web.url("down") and deferred["state"] == "scheduled"
        assert deferred["waits_for"] == "robots.txt (retryable: robots_503)"
        assert ended < deferred["not_before"] < ended + 10, (ended, deferred)  # it did not sit out the wait
        assert [h.resource for h in web.hits] == ["/robots.txt"]

        web.sites["down"].robots = None  # the server is back: robots.txt is 404 (allow all) now
        time.sleep(max(0.0, deferred["not_before"] - time.time()) + 0.2)
        resumed = CrawlProcess(
            [sys.executable, "-m", "hostring_cli", "crawl", "--resume", "--out", str(out)], out, tmp_path
        )
        assert resumed.start().wait(60) == 0, resumed.output()
        hits = Counter(h.resource for h in web.hits)
        assert hits == {"/robots.txt": 2, "/": 1, "/a": 1}, hits
        assert {h.user_agent for h in web.hits} == {UA}  # the stored settings
        report = load_report(out)
        assert report["finish"]["reason"] == "drained" and report["by_state"] == {"fetched": 2}
