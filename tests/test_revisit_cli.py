"""The revisit flags of `hostring crawl` and `hostring node`: durations, and bad input refused before anything
starts (exit 2, one line on stderr naming the flag and the fix, no traceback, nothing created)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from hostring_cli.cli import build_parser, frontier_config
from hostring_cli.revisit import parse_duration, revisit_node_args
from hostring_testing import CountingWeb
from hostring_testing.crawls import LOOPBACK, load_report, run_cli
from hostring_testing.pages import Page, Site, html_page

BAD = [
    (["--revisit", "sometimes"], "--revisit: unknown policy 'sometimes'; choose one of off, fixed, adaptive"),
    (["--revisit", "adaptive", "--revisit-interval", "0"], "--revisit-interval: '0' is not a positive duration"),
    (["--revisit", "fixed", "--revisit-interval=-5m"], "--revisit-interval: '-5m' is not a positive duration"),
    (["--revisit-interval", "soon"], "--revisit-interval: 'soon' is not a duration"),
    (["--revisit-min", "2h", "--revisit-max", "1h"], "--revisit-min (2h) is above --revisit-max (1h)"),
    (["--revisit-interval", "10s", "--revisit-min", "1m"], "--revisit-interval (10s) must lie within"),
    (["--revisit-share", "1.5"], "--revisit-share: '1.5' is not a number from 0 to 1"),
    (["--retention", "0s"], "--retention: '0s' is not a positive duration"),
]
CRAWL_ONLY = [
    (["--duration", "0"], "--duration: '0' is not a positive duration"),
    (["--duration=-1h"], "--duration: '-1h' is not a positive duration"),
    (["--duration", "an hour"], "--duration: 'an hour' is not a duration"),
]


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hostring_cli", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(("flags", "message"), BAD + CRAWL_ONLY)
def test_bad_revisit_input_stops_a_crawl_before_it_starts(flags: list[str], message: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _run(["crawl", "http://127.0.0.1:9/", "--out", str(out), *flags], tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hostring: ") and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not out.exists()  # nothing started: no store, no WARC, no node


@pytest.mark.parametrize(("flags", "message"), BAD)
def test_bad_revisit_input_stops_a_node_before_it_listens(flags: list[str], message: str, tmp_path: Path) -> None:
    store = tmp_path / "node.sqlite3"
    done = _run(["node", "--store", f"sqlite:///{store}", "--listen", "127.0.0.1:0", *flags], tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in done.stderr
    assert not store.exists()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("1.5m", 90.0), ("2h", 7200.0), ("7d", 604_800.0), (" 3 h ", 10_800.0),
     ("0.25", 0.25), ("1e3", 1000.0)],
)  # fmt: skip
def test_durations_are_seconds_or_take_a_unit(text: str, seconds: float) -> None:
    assert parse_duration(text, "--x") == seconds


def test_good_flags_make_the_policy_the_node_gets_too() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["crawl", "http://a.example/", "--revisit", "ADAPTIVE", "--revisit-interval", "90s", "--revisit-min", "1m",
         "--revisit-max", "1d", "--revisit-share", "0.25", "--retention", "2d", "--duration", "1m"]
    )  # fmt: skip
    revisit = frontier_config(args).revisit
    assert (revisit.policy, revisit.interval_s, revisit.min_s, revisit.max_s) == ("adaptive", 90, 60, 86_400)
    assert (revisit.share, revisit.retention_s) == (0.25, 172_800)
    node = parser.parse_args(["node", *revisit_node_args(revisit)])
    assert frontier_config(node).revisit == revisit
    defaults = frontier_config(parser.parse_args(["node"])).revisit
    assert (defaults.policy, defaults.interval_s, defaults.min_s, defaults.max_s) == ("off", 86_400, 8_640, 864_000)
    assert isinstance(args, argparse.Namespace)


# ---------------------------------------------------------------------------------------------- a crawl's run


def _busy_web() -> dict[str, Site]:
    """A home page, and a page that answers 503 with Retry-After: 3600 (a retry far off: idle-exit's case)."""
    busy = Page(status=503, body=b"busy\n", content_type="text/plain", headers={"Retry-After": "3600"})
    return {"a": Site(pages={"/": html_page('<a href="/busy">busy</a>'), "/busy": busy})}


def _crawl(web: CountingWeb, out: Path, *flags: str) -> list[str]:
    return [
        sys.executable, "-m", "hostring_cli", "crawl", web.url("a"), "--out", str(out), "--no-progress",
        "--allow-network", LOOPBACK, "--delay", "0.05", "--idle-exit", "1s", "--max-retry-after", "300", *flags,
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_continuous_crawl_ends_at_its_duration_not_as_idle_and_resumes_with_its_stored_policy(
    tmp_path: Path,
) -> None:
    with CountingWeb(_busy_web()) as web:
        # one-shot: the only work left is a retry an hour off, so the crawl ends as idle (exit 0: a page fetched)
        once = run_cli(_crawl(web, tmp_path / "once"), tmp_path / "once", tmp_path, 60)
        assert once.proc is not None and once.proc.returncode == 0, once.output()
        assert load_report(tmp_path / "once")["finish"]["reason"] == "idle"

        # continuous: the same wait is no reason to stop (a continuous crawl always waits for its next revisit)
        out = tmp_path / "out"
        flags = ("--revisit", "fixed", "--revisit-interval", "1h", "--duration", "5s")
        crawl = run_cli(_crawl(web, out, *flags), out, tmp_path, 60)
        assert crawl.proc is not None and crawl.proc.returncode == 0, crawl.output()
        assert crawl.duration >= 5.0  # it ran to its duration (the one-shot crawl above ended as idle)
        report = load_report(out)
        assert report["finish"]["reason"] == "duration" and report["finish"]["exit_code"] == 0
        assert report["revisits"]["policy"] == "fixed" and report["revisits"]["pending"] == 1
        assert "finished: duration reached" in crawl.stdout()
        stored = tomllib.loads((out / "crawl.toml").read_text(encoding="utf-8"))
        assert (stored["revisit"], stored["revisit-interval"], stored["duration"]) == ("fixed", 3600.0, 5.0)

        # --resume runs the node with the stored policy; a flag given now overrides the stored one and is recorded
        resumed = run_cli(
            [sys.executable, "-m", "hostring_cli", "crawl", "--resume", "--out", str(out), "--duration", "2s"],
            out, tmp_path, 60, name="resumed",
        )  # fmt: skip
        assert resumed.proc is not None and resumed.proc.returncode == 0, resumed.output()
        assert "duration 2.0 (was 5.0, from --duration)" in resumed.stderr(), resumed.output()
        report = load_report(out)
        assert report["finish"]["reason"] == "duration" and report["revisits"]["policy"] == "fixed"
        stored = tomllib.loads((out / "crawl.toml").read_text(encoding="utf-8"))
        assert (stored["revisit"], stored["duration"], len(stored["runs"])) == ("fixed", 2.0, 2)
    assert Counter(h.resource for h in web.hits)["/"] == 2  # the one-shot crawl's and the continuous one's
