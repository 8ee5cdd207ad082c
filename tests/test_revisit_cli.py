"""The revisit flags of `hostring crawl` and `hostring node`: durations, and bad input refused before anything
starts (exit 2, one line on stderr naming the flag and the fix, no traceback, nothing created)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from hostring_cli.cli import build_parser, frontier_config
from hostring_cli.revisit import parse_duration, revisit_node_args

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
