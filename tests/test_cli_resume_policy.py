"""The issue's first complaint, replayed: a crawl without --allow-network refuses a loopback site, and a resume
with the right flag fetches it; a resume with a wider --scope follows the links the narrower one refused. Also how
a crawl ends when its budget is reached. Real `hostring crawl` processes against a loopback web.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from hostring_testing import CountingWeb
from hostring_testing.crawls import LOOPBACK, UA, CrawlProcess, journal, load_report
from hostring_testing.pages import Site, html_page

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def links(*hrefs: str) -> str:
    return "".join(f'<a href="{h}">{h}</a>' for h in hrefs)


def sites() -> dict[str, Site]:
    return {
        "a": Site(pages={"/": html_page(links("/1", "/2", "{{origin:b}}/")), "/1": html_page(""), "/2": html_page("")}),
        "b": Site(pages={"/": html_page(links("/x")), "/x": html_page("")}),
    }


def crawl(out: Path, tmp: Path, name: str, *args: str) -> CrawlProcess:
    cmd = [sys.executable, "-m", "hostring_cli", "crawl", "--out", str(out), "--no-progress", *args]
    proc = CrawlProcess(cmd, out, tmp, name).start()
    proc.wait(90)
    return proc


def test_a_refused_crawl_resumed_with_the_right_flags_fetches_what_was_refused(tmp_path: Path) -> None:
    out = tmp_path / "crawl"
    with CountingWeb(sites()) as web:
        first = crawl(out, tmp_path, "first", web.url("a"), "--delay", "0.05", "--user-agent", UA)
        assert first.proc is not None and first.proc.returncode == 3, first.output()  # nothing fetchable
        text = first.stdout()
        assert "suppressed:network_policy 1" in text and "-> fix: --allow-network CIDR" in text, text
        assert web.connections["a"] == 0

        # Resumed with the allowlist: the refusal is reconsidered; the scope (domain) still keeps b out.
        second = crawl(out, tmp_path, "second", "--resume", "--allow-network", LOOPBACK)
        assert second.proc is not None and second.proc.returncode == 0, second.output()
        assert "allow-network 127.0.0.0/8 (was none, from --allow-network)" in second.stderr()
        assert "refused by network_policy scheduled again" in second.stderr()
        report = load_report(out)
        assert report["by_state"] == {"fetched": 3, "rejected": 1}, report["by_state"]
        assert "rejected:out_of_scope" in report["by_reason"] and "-> fix: --scope all" in second.stdout()
        assert {r["reason"] for r in journal(out, event="reconsider")} == {"reconsidered:network_policy"}

        # Resumed with a wider scope: the link to b is followed now. Every page was fetched once.
        third = crawl(out, tmp_path, "third", "--resume", "--scope", "all")
        assert third.proc is not None and third.proc.returncode == 0, third.output()
        report = load_report(out)
        assert report["by_state"] == {"fetched": 5}, report["by_state"]
        assert report["admitted"] == report["discovered_by_verdict"]["admitted"] + 1  # b/ came back by reconsider
        hits = Counter((h.label, h.resource) for h in web.hits if h.resource != "/robots.txt")
        assert hits == {("a", "/"): 1, ("a", "/1"): 1, ("a", "/2"): 1, ("b", "/"): 1, ("b", "/x"): 1}, hits
        settings = (out / "crawl.toml").read_text()
        assert 'allow-network = ["127.0.0.0/8"]' in settings and 'scope = "all"' in settings
        assert settings.count("[[runs]]") == 3


def test_a_crawl_that_reaches_its_budget_says_so(tmp_path: Path) -> None:
    out = tmp_path / "crawl"
    with CountingWeb(sites()) as web:
        run = crawl(out, tmp_path, "budget", web.url("a"), "--allow-network", LOOPBACK, "--max-pages", "2",
                    "--delay", "0.05", "--user-agent", UA)  # fmt: skip
        assert run.proc is not None and run.proc.returncode == 0, run.output()
        text = run.stdout()
        assert text.startswith("finished: budget reached (--max-pages)"), text
        assert "links suppressed by pages_total" in text and "-> fix: --max-pages N" in text
        assert load_report(out)["finish"]["reason"] == "budget"
