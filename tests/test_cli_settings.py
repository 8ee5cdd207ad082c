"""Where `hostring`'s settings come from (flags, HOSTRING_* variables, a TOML file, a crawl's stored settings),
in which order, and the help that says so. In-process: the parser and the resolution, no crawl."""

from __future__ import annotations

import argparse
import io
import logging
import math
import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hostring import logs
from hostring.v1 import frontier_pb2 as pb
from hostring_cli.args import Parser
from hostring_cli.cli import build_parser, main
from hostring_cli.progress import Progress, render
from hostring_cli.settings import Settings, resolve, toml_value


def settle(argv: list[str], env: dict[str, str] | None = None, **stored: object) -> tuple[argparse.Namespace, Settings]:
    parser = build_parser()
    args = parser.parse_args(argv)
    settings = resolve(parser, args, argv, env or {}, stored=stored or None, stored_name="stored in OUT/crawl.toml")
    return args, settings


def test_precedence_flag_env_file_stored_default(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    config.write_text('delay = 4\nmax-depth = 6\nfetchers = 7\nuser_agent = "filebot/1"\n[crawl]\nlease-s = 8\n')
    env = {"HOSTRING_DELAY": "3", "HOSTRING_MAX_DEPTH": "5", "HOSTRING_CONFIG": str(config)}
    args, s = settle(["crawl", "http://a.example/", "--delay", "2"], env, lease_s=11.0, concurrency=3, retry_base_s=9.0)
    assert args.delay == 2.0 and s.sources["delay"] == "--delay"
    assert args.max_depth == 5 and s.sources["max_depth"] == "HOSTRING_MAX_DEPTH"
    assert args.fetchers == 7 and s.sources["fetchers"] == f"--config {config}"
    assert args.user_agent == "filebot/1"
    assert args.lease_s == 8.0  # the [crawl] table
    assert args.concurrency == 3 and s.sources["concurrency"] == "stored in OUT/crawl.toml"
    assert args.retry_base_s == 9.0
    assert args.max_attempts == 3 and s.sources["max_attempts"] == "default"


def test_a_flag_equal_to_the_default_still_overrides_the_stored_value() -> None:
    args, s = settle(["crawl", "--resume", "--delay", "1.0"], delay=0.25)
    assert args.delay == 1.0 and s.sources["delay"] == "--delay"
    assert s.changes({"delay": 0.25}, skip=["resume"]) == ["delay 1.0 (was 0.25, from --delay)"]
    args, _ = settle(["crawl", "--resume"], delay=0.25)
    assert args.delay == 0.25


def test_lists_switches_and_durations_from_the_environment() -> None:
    env = {
        "HOSTRING_ALLOW_NETWORK": "127.0.0.0/8, 10.0.0.0/8",
        "HOSTRING_NO_PROGRESS": "yes",
        "HOSTRING_IDLE_EXIT": "2m",
    }
    args, _ = settle(["crawl", "http://a.example/"], env)
    assert args.allow_network == ["127.0.0.0/8", "10.0.0.0/8"]
    assert args.no_progress is True and args.idle_exit == 120.0
    args, _ = settle(["crawl", "http://a.example/", "--allow-network", "::1"], env)
    assert args.allow_network == ["::1"]  # the flag replaces the variable's list


def test_a_file_can_serve_several_commands(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    config.write_text('store = "memory://"\ndelay = 2\n[node]\nid = "n7"\n[crawl]\ndelay = 3\n')
    args, _ = settle(["node", "--config", str(config)])
    assert (args.store, args.id, args.delay) == ("memory://", "n7", 2.0)
    args, _ = settle(["crawl", "http://a.example/", "--config", str(config)])  # `store` is the node's: skipped
    assert args.delay == 3.0


def test_global_flags_before_or_after_the_command() -> None:
    for argv in (["--log-level", "DEBUG", "crawl", "x"], ["crawl", "x", "--log-level", "DEBUG"]):
        args, _ = settle(argv)
        assert args.log_level == "DEBUG" and args.log_format == "auto"
    args, _ = settle(["--log-format", "json", "report", "--log-level", "WARNING"])
    assert (args.log_format, args.log_level) == ("json", "WARNING")
    args, _ = settle(["report"], {"HOSTRING_LOG_LEVEL": "ERROR"})
    assert args.log_level == "ERROR"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("hostring 0.")


def test_every_option_has_help_and_shows_its_default() -> None:
    parser = build_parser()
    missing, no_default = [], []
    for option in parser.all_options():
        action = option.action
        text = action.help or ""
        if text in ("", argparse.SUPPRESS):
            missing.append(option.flag)
        shows = action.default not in (None, False, "", [], argparse.SUPPRESS) and option.kind != "version"
        if shows and "default" not in text:
            no_default.append(option.flag)
    assert missing == [] and no_default == []
    assert isinstance(parser, Parser) and {"crawl", "node", "worker", "seed", "report", "hosts"} <= set(parser.commands)


def test_the_crawl_help_has_the_legend_precedence_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["crawl", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in (
        "The live line shows",
        "fetched (responses, robots.txt included)",
        "queue (URLs waiting",
        "flight (fetches under way",
        "waiting until",
        "HOSTRING_MAX_DEPTH",
        "flag > environment > file > default",
        "3 nothing fetchable",
        "(default: 60s)",
    ):
        assert words in text, words


@given(
    st.one_of(
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(alphabet=st.characters(blacklist_categories=("Cs",))),
        st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",))), max_size=4),
    )
)
def test_stored_values_read_back_as_written(value: object) -> None:
    """What OUT/crawl.toml records is TOML that reads back as the same value (any text, any finite float)."""
    back = tomllib.loads(f"v = {toml_value(value)}\n")["v"]
    if isinstance(value, float):
        assert math.isclose(back, value, rel_tol=0, abs_tol=0) or back == value
    else:
        assert back == value


def test_the_progress_line_fits_80_columns() -> None:
    big = pb.StatsResponse(queued=9_999_999, in_flight=999, hosts_ready=99_999, hosts_with_work=999_999)
    line = render(big, fetched=9_999_999, errors=99_999, elapsed=99 * 3600 + 59 * 60 + 59)
    assert len(line) <= 79, (len(line), line)
    waiting = pb.StatsResponse(
        queued=3, next_ready_s=600, waiting_for="robots.txt of http://127.0.0.2:8080 (robots_503)"
    )
    text = render(waiting, fetched=0, errors=0, elapsed=12)
    assert text.startswith("queue 3  waiting until ") and text.endswith(": robots.txt of 127.0.0.2:8080 (robots_503)")
    dated = re.search(r"until \d{4}-\d\d-\d\d ", text) is not None  # the wait ends tomorrow (close to midnight)
    assert len(text) - (11 if dated else 0) < 80, text


def test_log_records_print_above_the_live_line_not_through_it() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    logs.setup_logging("INFO", stream=screen)
    try:
        progress = Progress(screen, enabled=True)
        stats = pb.StatsResponse(queued=5, in_flight=1, hosts_ready=1, hosts_with_work=2)
        progress.update(stats, fetched=3, errors=0)
        logging.getLogger("hostring.worker").warning("complete on a node failed, retrying")
        progress.note("stopping: 1 fetch in flight may finish")
        progress.close()
    finally:
        logs.set_status_line(None)
        logs.setup_logging("INFO")
    frames = [re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", part) for part in re.split(r"[\r\n]", screen.getvalue())]
    frames = [f for f in frames if f]
    record = [f for f in frames if "complete on a node failed" in f]
    assert len(record) == 1 and record[0].endswith("retrying") and "fetched" not in record[0], frames
    note = frames.index("stopping: 1 fetch in flight may finish")
    assert frames[note - 1].startswith("fetched 3") and frames[note + 1].startswith("fetched 3"), frames  # redrawn
