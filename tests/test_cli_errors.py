"""Every bad input an operator can give `hostring`, as a table: the exit code, one line on stderr that names the
thing and the fix, no traceback, and no crawl directory left behind.

Each row is a real `hostring` process (they run a few at a time). Dependencies that are down are addresses
nothing listens on (127.0.0.1:1); nothing here leaves loopback.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from frontier_node.core.frontier import Frontier
from frontier_node.core.records import Link
from frontier_node.store.sqlite import SqliteStore
from hostring.clock import WallClock
from hostring_testing.proc import REPO

# One worker runs the whole module (--dist loadgroup): its module fixture starts every case's processes once.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.xdist_group("cli_errors")]

DOWN = "127.0.0.1:1"  # nothing listens there
SEED = "http://a.example/"


@dataclass
class Case:
    """One bad command line: what must come back."""

    args: list[str]
    code: int
    says: tuple[str, ...]  # words the one stderr line must contain (the thing and the fix)
    env: dict[str, str] = field(default_factory=dict)
    out: bool = True  # a crawl case: OUT must not exist afterwards


def cases(tmp: Path) -> dict[str, Case]:
    a_file = tmp / "a-file"
    a_file.write_text("not a directory\n")
    bad_toml = tmp / "bad.toml"
    bad_toml.write_text("fetchers = 4\ndelay = = 1\n")
    typo_toml = tmp / "typo.toml"
    typo_toml.write_text("delya = 2\n")
    typed_toml = tmp / "typed.toml"
    typed_toml.write_text("[crawl]\nfetchers = 0\n")
    binary_seeds = tmp / "binary-seeds.txt"
    binary_seeds.write_bytes(b"http://a.example/\n\xff\xfe\n")
    binary_scope = tmp / "binary-scope.txt"
    binary_scope.write_bytes(b"a.example\n\xff\xfe\n")
    huge_seed = tmp / "huge-seed.txt"
    huge_seed.write_text("http://a.example/" + "a" * 1_000_000 + "\n")
    binary_toml = tmp / "binary.toml"
    binary_toml.write_bytes(b"fetchers = 4\n\xff\xfe\n")
    odd_token = tmp / "odd-token"
    odd_token.write_bytes(b"s3cr\xc3\xa9t\n")
    seeds_toml = tmp / "seeds.toml"
    seeds_toml.write_text('seeds = "http://a.example/"\n')
    table_seeds_toml = tmp / "table-seeds.toml"
    table_seeds_toml.write_text('[crawl]\nseeds = ["notaurl"]\n')
    share_toml = tmp / "share.toml"
    share_toml.write_text("revisit-share = 2\n")
    empty = tmp / "empty-dir"
    empty.mkdir()
    held = tmp / "held"
    held.mkdir()
    (held / "frontier.sqlite3").write_bytes(b"")

    def crawl(*args: str, out: str = "OUT") -> list[str]:
        return ["crawl", SEED, "--out", out, *args]

    return {
        "fetchers 0": Case(crawl("--fetchers", "0"), 2, ("--fetchers", ">= 1")),
        # (a bad --fetchers after it: should --workers 100000 pass again, the crawl stops there, starting nothing)
        "workers beyond the bound": Case(
            crawl("--workers", "100000", "--fetchers", "0"), 2, ("--workers", "from 1 to 256")
        ),
        "max-depth -1": Case(crawl("--max-depth", "-1"), 2, ("--max-depth", ">= 0")),
        "max-pages 0": Case(crawl("--max-pages", "0"), 2, ("--max-pages",)),
        "delay -1": Case(crawl("--delay", "-1"), 2, ("--delay",)),
        "delay nan": Case(crawl("--delay", "nan"), 2, ("--delay", "finite")),
        "max-pages of 400 digits": Case(crawl("--max-pages", "1" + "0" * 400), 2, ("--max-pages", "out of range")),
        "env max-depth of 400 digits": Case(
            crawl(), 2, ("HOSTRING_MAX_DEPTH", "out of range"), env={"HOSTRING_MAX_DEPTH": "9" * 400}
        ),
        "lease beyond int64 milliseconds": Case(crawl("--lease-s", "1e307"), 2, ("--lease-s", "out of range", "2^53")),
        "revisit interval beyond range": Case(crawl("--revisit-interval", "1e300d"), 2, ("--revisit-interval", "2^53")),
        "bad CIDR": Case(crawl("--allow-network", "10.0.0.0/33"), 2, ("--allow-network", "CIDR")),
        "bad duration": Case(crawl("--idle-exit", "soon"), 2, ("--idle-exit", "duration")),
        "port too big": Case(crawl("--metrics-port", "70000"), 2, ("--metrics-port",)),
        "metrics port 0 for a crawl": Case(crawl("--metrics-port", "0"), 2, ("--metrics-port 0", "PORT+1")),
        "no port for the node": Case(crawl("--metrics-port", "65535"), 2, ("--metrics-port", "65534")),
        "bad user agent": Case(crawl("--user-agent", "bot9/1.0"), 2, ("--user-agent", "product token")),
        "user agent with a line break": Case(
            ["worker", "--node", DOWN, "--user-agent", "bot/1.0\r\nX-Evil: 1"],
            2,
            ("--user-agent", "HTTP header cannot carry"),
            out=False,
        ),
        "env user agent not ASCII": Case(
            crawl(), 2, ("HOSTRING_USER_AGENT", "non-ASCII"), env={"HOSTRING_USER_AGENT": "bot/1.0 (caf\u00e9)"}
        ),
        "bad log level": Case(crawl("--log-level", "LOUD"), 2, ("--log-level",)),
        "seed not a URL": Case(["crawl", "notaurl", "--out", "OUT"], 2, ("not a crawlable URL", "http://")),
        "no seed": Case(["crawl", "--out", "OUT"], 2, ("SEED", "--resume")),
        "missing seeds file": Case(crawl("--seeds-file", str(tmp / "none.txt")), 2, ("--seeds-file", "none.txt")),
        "seeds file of one huge line": Case(
            crawl("--seeds-file", str(huge_seed)), 2, ("1,000,017 characters", "too_long")
        ),
        "seeds file not UTF-8": Case(crawl("--seeds-file", str(binary_seeds)), 2, ("--seeds-file", "not UTF-8")),
        "scope file not UTF-8": Case(crawl("--scope", str(binary_scope)), 2, ("--scope", "binary-scope.txt", "UTF-8")),
        "missing scope file": Case(crawl("--scope", str(tmp / "none.txt")), 2, ("--scope", "all, host, domain")),
        "scope a directory": Case(crawl("--scope", str(empty)), 2, ("--scope", "is a directory")),
        "scope empty": Case(crawl("--scope", ""), 2, ("--scope is empty", "all, host, domain")),
        "scope list without file": Case(crawl("--scope", "list"), 2, ("--scope-file",)),
        # (a bad --fetchers after it: should --out "" pass again, the crawl stops there, not in the current directory)
        "out empty": Case(["crawl", SEED, "--out", "", "--fetchers", "0"], 2, ("--out", "empty path"), out=False),
        "env out blank": Case(
            ["crawl", SEED],
            2,
            ("HOSTRING_OUT", "empty path"),
            env={"HOSTRING_OUT": " ", "HOSTRING_FETCHERS": "0"},
            out=False,
        ),
        "seeds file empty name": Case(crawl("--seeds-file", ""), 2, ("--seeds-file", "empty path")),
        "out is a file": Case(crawl(out=str(a_file)), 2, ("--out", "is a file"), out=False),
        "out under a file": Case(crawl(out=str(a_file / "sub")), 2, ("--out", "is a file"), out=False),
        "out under /proc": Case(crawl(out="/proc/hostring-test/out"), 2, ("--out", "cannot create"), out=False),
        "resume nothing": Case(["crawl", "--resume", "--out", str(empty)], 2, ("nothing to resume",), out=False),
        "occupied out": Case(crawl(out=str(held)), 2, ("already holds a crawl", "--resume"), out=False),
        "missing config": Case(crawl("--config", str(tmp / "none.toml")), 2, ("--config", "no such file")),
        "config not TOML": Case(crawl("--config", str(bad_toml)), 2, ("not valid TOML", "line 2")),
        "config not UTF-8": Case(crawl("--config", str(binary_toml)), 2, ("--config", "binary.toml", "not UTF-8")),
        "config seeds not a list": Case(
            ["crawl", "--out", "OUT", "--config", str(seeds_toml)], 2, ("seeds must be a list", "http://a.example/")
        ),
        "config seeds in the crawl table": Case(
            ["crawl", "--out", "OUT", "--config", str(table_seeds_toml)], 2, ("not a crawlable URL", "notaurl")
        ),
        "config typo": Case(crawl("--config", str(typo_toml)), 2, ("unknown setting 'delya'",)),
        "config bad value": Case(crawl("--config", str(typed_toml)), 2, ("fetchers", ">= 1")),
        "env bad value": Case(crawl(), 2, ("HOSTRING_FETCHERS", ">= 1"), env={"HOSTRING_FETCHERS": "0"}),
        "env not a number": Case(crawl(), 2, ("HOSTRING_DELAY", "not a number"), env={"HOSTRING_DELAY": "abc"}),
        "revisit unknown policy": Case(crawl("--revisit", "often"), 2, ("--revisit", "off, fixed, adaptive")),
        "revisit interval 0": Case(crawl("--revisit-interval", "0"), 2, ("--revisit-interval", "positive duration")),
        "revisit max below the default min": Case(
            crawl("--revisit-interval", "1d", "--revisit-max", "1h"), 2, ("--revisit-min", "interval / 10 by default")
        ),
        "revisit min above max": Case(
            crawl("--revisit-min", "2h", "--revisit-max", "1h"), 2, ("--revisit-min", "--revisit-max")
        ),
        "revisit interval outside": Case(
            crawl("--revisit-interval", "1d", "--revisit-min", "1m", "--revisit-max", "1h"),
            2,
            ("--revisit-interval", "must lie within"),
        ),
        "revisit share 2": Case(crawl("--revisit-share", "2"), 2, ("--revisit-share", "from 0 to 1")),
        "retention negative": Case(crawl("--retention=-1d"), 2, ("--retention", "positive duration")),
        "grace negative": Case(crawl("--grace", "-1"), 2, ("--grace", "must not be negative")),
        "env idle exit negative": Case(
            crawl(), 2, ("HOSTRING_IDLE_EXIT", "must not be negative"), env={"HOSTRING_IDLE_EXIT": "-1m"}
        ),
        "duration not a duration": Case(crawl("--duration", "forever"), 2, ("--duration", "not a duration")),
        "env bad revisit interval": Case(
            crawl(), 2, ("HOSTRING_REVISIT_INTERVAL", "positive duration"), env={"HOSTRING_REVISIT_INTERVAL": "0s"}
        ),
        "env unknown revisit policy": Case(
            crawl(), 2, ("HOSTRING_REVISIT", "unknown policy"), env={"HOSTRING_REVISIT": "sometimes"}
        ),
        "config bad revisit share": Case(crawl("--config", str(share_toml)), 2, ("revisit-share", "from 0 to 1")),
        "node revisit min above max": Case(
            ["node", "--revisit-min", "1d", "--revisit-max", "1h"], 2, ("--revisit-min", "--revisit-max"), out=False
        ),
        "refetch bad time": Case(
            ["revisit", "refetch", SEED, "--node", DOWN, "--at", "tomorrow"], 2, ("--at", "ISO 8601"), out=False
        ),
        "refetch ISO time before 1970": Case(
            ["revisit", "refetch", SEED, "--node", DOWN, "--at", "0001-01-01T00:00:00"],
            2,
            ("--at", "out of range", "1970"),
            out=False,
        ),
        "refetch node down": Case(
            ["revisit", "refetch", SEED, "--node", DOWN, "--timeout", "1"],
            1,
            ("frontier node at 127.0.0.1:1",),
            out=False,
        ),
        "revisit policy without a change": Case(
            ["revisit", "policy", "a.example", "--node", DOWN], 2, ("--revisit", "--revisit-interval"), out=False
        ),
        "node redis without coordinator": Case(
            ["node", "--store", "redis://127.0.0.1:1/0"], 2, ("redis://", "--coordinator"), out=False
        ),
        "node unknown store": Case(["node", "--store", "ftp://x/y"], 2, ("--store", "sqlite:///PATH"), out=False),
        "node wildcard without advertise": Case(
            ["node", "--coordinator", DOWN, "--store", "redis://127.0.0.1:1/0", "--listen", "0.0.0.0:0"],
            2,
            ("--listen 0.0.0.0:0", "--advertise"),
            out=False,
        ),
        "node store not SQLite": Case(
            ["node", "--store", f"sqlite:///{a_file}", "--listen", "127.0.0.1:0"],
            2,
            ("--store", "not a usable SQLite store"),
            out=False,
        ),
        "node store under /proc": Case(
            ["node", "--store", "sqlite:////proc/hostring-test/x.sqlite3", "--listen", "127.0.0.1:0"],
            2,
            ("--store", "cannot open /proc/hostring-test"),
            out=False,
        ),
        "node exit-with-parent negative": Case(
            ["node", "--store", "memory://", "--listen", "127.0.0.1:0", "--exit-with-parent", "-5"],
            2,
            ("--exit-with-parent", ">= 1"),
            out=False,
        ),
        "node exit-with-parent not the parent": Case(
            ["node", "--store", "memory://", "--listen", "127.0.0.1:0", "--exit-with-parent", "1"],
            1,
            ("--exit-with-parent 1", "not this process's parent"),
            out=False,
        ),
        "node listen not an IP address": Case(
            ["node", "--store", "memory://", "--listen", "256.1.1.1:0"],
            2,
            ("--listen", "'256.1.1.1' is not an IP address"),
            out=False,
        ),
        # (192.0.2.0/24 is TEST-NET-1, on no interface: the check binds a socket to it, which sends nothing)
        "coordinator listen not on this machine": Case(
            ["coordinator", "--listen", "192.0.2.1:0"], 2, ("--listen", "not an address of this machine"), out=False
        ),
        "node weight 0": Case(["node", "--weight", "0"], 2, ("--weight",), out=False),
        # (a bad --delay after it: should --weight 101 pass again, the node stops there instead of serving)
        "node weight above the ring's bound": Case(
            ["node", "--weight", "101", "--delay", "-1"], 2, ("--weight", "from 1 to 100"), out=False
        ),
        "node redis down": Case(
            ["node", "--coordinator", DOWN, "--store", "redis://127.0.0.1:1/0", "--listen", "127.0.0.1:0"],
            1,
            ("Redis at redis://127.0.0.1:1/0", "--store"),
            out=False,
        ),
        "coordinator redis not a URL": Case(
            ["coordinator", "--redis", "127.0.0.1:6379", "--listen", "127.0.0.1:0"],
            2,
            ("--redis", "redis://"),
            out=False,
        ),
        "node redis port not a port": Case(
            ["node", "--coordinator", DOWN, "--store", "redis://127.0.0.1:99999/0", "--listen", "127.0.0.1:0"],
            2,
            ("--store redis://127.0.0.1:99999/0", "Port"),
            out=False,
        ),
        "coordinator redis down": Case(
            ["coordinator", "--redis", "redis://127.0.0.1:1/0", "--listen", "127.0.0.1:0"],
            1,
            ("Redis at redis://127.0.0.1:1/0", "--redis"),
            out=False,
        ),
        "worker without a source": Case(["worker"], 2, ("--coordinator", "--node"), out=False),
        "worker bad user agent": Case(
            ["worker", "--node", DOWN, "--user-agent", "/1.0"], 2, ("--user-agent", "product token"), out=False
        ),
        "worker out under /proc": Case(
            ["worker", "--node", DOWN, "--out", "/proc/hostring-test/warc"], 2, ("--out", "cannot create"), out=False
        ),
        "worker counts file under /proc": Case(
            ["worker", "--node", DOWN, "--counts-file", "/proc/hostring-test/counts.json"],
            2,
            ("--counts-file", "cannot write"),
            out=False,
        ),
        "worker coordinator down": Case(
            ["worker", "--coordinator", DOWN, "--connect-timeout", "1"], 1, ("coordinator at 127.0.0.1:1",), out=False
        ),
        "seed without URLs": Case(["seed", "--node", DOWN], 2, ("URLs", "--seeds-file"), out=False),
        "seed node down": Case(
            ["seed", "--node", DOWN, SEED, "--timeout", "1"], 1, ("frontier node at 127.0.0.1:1", "--node"), out=False
        ),
        "seed file not UTF-8": Case(
            ["seed", "--node", DOWN, "--seeds-file", str(binary_seeds)], 2, ("--seeds-file", "not UTF-8"), out=False
        ),
        "seed empty node": Case(["seed", "--node", "", SEED], 2, ("--node", "empty address"), out=False),
        "worker empty node": Case(["worker", "--node", " "], 2, ("--node", "empty address"), out=False),
        "report empty node": Case(["report", "--node", ""], 2, ("--node", "empty address"), out=False),
        "status empty coordinator": Case(
            ["status", "--coordinator", ""], 2, ("--coordinator", "empty address"), out=False
        ),
        "env empty node": Case(["report"], 2, ("HOSTRING_NODE", "empty address"), env={"HOSTRING_NODE": ""}, out=False),
        "seed bad URL": Case(["seed", "--node", DOWN, "ftp://x/"], 2, ("not a crawlable URL",), out=False),
        "report empty store": Case(["report", "--store", ""], 2, ("--store", "empty path"), out=False),
        "report no store": Case(
            ["report", "--store", f"sqlite:///{tmp / 'none.sqlite3'}"], 2, ("--store", "no store"), out=False
        ),
        "report TLS CA not PEM": Case(
            ["report", "--node", DOWN, "--timeout", "1", "--tls-ca", str(a_file)],
            2,
            ("a-file", "not a PEM file"),
            out=False,
        ),
        "node TLS certificate not PEM": Case(
            [
                "node",
                "--store",
                "memory://",
                "--listen",
                "127.0.0.1:0",
                "--tls-cert",
                str(a_file),
                "--tls-key",
                str(a_file),
            ],
            2,
            ("TLS certificate", "not a PEM file"),
            out=False,
        ),
        "report node down": Case(
            ["report", "--node", DOWN, "--timeout", "1"], 1, ("frontier node at 127.0.0.1:1",), out=False
        ),
        # (gRPC turns a deadline this far off into an immediate DEADLINE_EXCEEDED, read as a node that is down)
        "report timeout beyond a day": Case(
            ["report", "--node", DOWN, "--timeout", "9e9"], 2, ("--timeout", "at most 86400"), out=False
        ),
        "worker connect timeout beyond a day": Case(
            ["worker", "--coordinator", DOWN, "--connect-timeout", "1e10"],
            2,
            ("--connect-timeout", "at most 86400"),
            out=False,
        ),
        "status coordinator down": Case(
            ["status", "--coordinator", DOWN, "--timeout", "1"], 1, ("coordinator at 127.0.0.1:1",), out=False
        ),
        "hosts node down": Case(
            ["hosts", "list", "--node", DOWN, "--timeout", "1"],
            1,
            ("frontier node at 127.0.0.1:1", "--node"),
            out=False,
        ),
        "hosts policy without a change": Case(
            ["hosts", "policy", "a.example", "--node", DOWN], 2, ("--delay", "--concurrency"), out=False
        ),
        "hosts bad URL": Case(
            ["hosts", "show", "http://[::1", "--node", DOWN], 2, ("not a host name or URL", "http://[::1"), out=False
        ),
        "admin token not ASCII": Case(
            ["hosts", "pause", "a.example", "--node", DOWN, "--admin-token-file", str(odd_token)],
            2,
            ("odd-token", "printable ASCII"),
            out=False,
        ),
        "admin token with a line break": Case(
            ["hosts", "pause", "a.example", "--node", DOWN],
            2,
            ("$HOSTRING_ADMIN_TOKEN", "printable ASCII"),
            env={"HOSTRING_ADMIN_TOKEN": "one\ntwo"},
            out=False,
        ),
        "hosts host not UTF-8": Case(
            ["hosts", "show", "a\udcff.example", "--node", DOWN], 2, ("HOST", "not UTF-8"), out=False
        ),
        "revisit URL not UTF-8": Case(
            ["revisit", "refetch", "http://a\udcff/", "--node", DOWN], 2, ("URL", "not UTF-8"), out=False
        ),
        "worker id not UTF-8": Case(["worker", "--node", DOWN, "--id", "w\udcff"], 2, ("--id", "not UTF-8"), out=False),
        "hosts bad limit": Case(["hosts", "list", "--node", DOWN, "--limit", "0"], 2, ("--limit",), out=False),
        "demo out under /proc": Case(
            ["demo", "--out", "/proc/hostring-test/demo"], 2, ("--out", "cannot create"), out=False
        ),
        "demo out is a file": Case(["demo", "--out", str(a_file)], 2, ("--out", "cannot create"), out=False),
        "demo bad delay": Case(["demo", "--delay", "-1"], 2, ("--delay",), out=False),
        "unknown command": Case(["crawlx"], 2, ("invalid choice",), out=False),
        "unknown flag": Case(["crawl", SEED, "--delya", "1"], 2, ("unrecognized arguments: --delya",), out=False),
    }


@dataclass
class Ran:
    case: Case
    out: Path
    code: int
    stderr: str
    stdout: str


def run_case(case: Case, out: Path) -> Ran:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTRING_")}
    env.update(case.env)
    args = [a if a != "OUT" else str(out) for a in case.args]
    done = subprocess.run(
        [sys.executable, "-m", "hostring_cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    return Ran(case, out, done.returncode, done.stderr, done.stdout)


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ran]:
    tmp = tmp_path_factory.mktemp("bad-input")
    table = cases(tmp)
    with ThreadPoolExecutor(max_workers=6) as pool:
        futures = {
            name: pool.submit(run_case, case, tmp / "outs" / name.replace(" ", "-")) for name, case in table.items()
        }
        return {name: f.result() for name, f in futures.items()}


def names() -> list[str]:
    """The table's case names, listed at collection time from a directory removed right after."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hostring-case-names-") as tmp:
        return list(cases(Path(tmp)))


@pytest.mark.parametrize("name", names())
def test_bad_input(name: str, ran: dict[str, Ran]) -> None:
    r = ran[name]
    where = f"hostring {' '.join(r.case.args)}\n--- stderr\n{r.stderr}\n--- stdout\n{r.stdout}"
    assert r.code == r.case.code, where
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, where  # one line: no traceback, no usage block
    assert "Traceback" not in r.stderr, where
    for word in r.case.says:
        assert word in lines[0], f"{word!r} not named\n{where}"
    if r.case.out:
        assert not r.out.exists(), f"a failed start left {r.out} behind"


def test_a_failed_start_leaves_no_half_made_out(tmp_path: Path) -> None:
    """The crawl's node cannot start (the port for its metrics is taken): one line naming the cause, exit 1, and
    neither OUT nor the parents it made are left, so the same command runs once the port is free."""
    out = tmp_path / "deep" / "out"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        node_port = taken.getsockname()[1]
        r = run_case(Case(["crawl", SEED, "--out", "OUT", "--metrics-port", str(node_port - 1)], 1, ()), out)
    where = f"--- stderr\n{r.stderr}"
    assert r.code == 1 and len(r.stderr.strip().splitlines()) == 1, where
    assert "frontier node did not start" in r.stderr and "in use" in r.stderr, where
    assert not (tmp_path / "deep").exists(), "the failed start left its directories behind"


def test_a_resume_that_does_not_start_leaves_the_settings_as_they_were(tmp_path: Path) -> None:
    """`crawl --resume` with a flag that keeps the node from starting (its metrics port is taken): exit 1, and
    OUT/crawl.toml neither takes that flag's value nor records a run, so a plain --resume works as before."""
    out = tmp_path / "out"
    out.mkdir()
    SqliteStore(out / "frontier.sqlite3").close()
    settings = out / "crawl.toml"
    settings.write_text('delay = 2.0\nseeds = ["http://a.example/"]\n\n[[runs]]\nhow = "start"\n')
    before = settings.read_bytes()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        node_port = taken.getsockname()[1]
        r = run_case(Case(["crawl", "--resume", "--out", "OUT", "--metrics-port", str(node_port - 1)], 1, ()), out)
    assert r.code == 1 and "frontier node did not start" in r.stderr, r.stderr
    assert settings.read_bytes() == before


@pytest.mark.parametrize(
    ("stored", "says"),
    [
        ('seeds = "http://a.example/"\n', "crawl.toml: seeds must be a list of URLs"),
        ('seeds = ["http://a.example/"]\nruns = "gone"\n', "crawl.toml: runs must be a list of [[runs]] tables"),
    ],
)
def test_a_resume_with_a_hand_edited_list_that_is_no_list_is_refused(tmp_path: Path, stored: str, says: str) -> None:
    """OUT/crawl.toml edited by hand to a string where a list belongs (seeds = "URL", runs = "..."): a usage error
    naming the file and the key, and the file is left as it was (not rewritten as seeds = ["h", "t", ...], nor
    with its history of runs dropped). (fetchers = 0 after it: should the check go, the resume stops there.)"""
    out = tmp_path / "out"
    out.mkdir()
    SqliteStore(out / "frontier.sqlite3").close()
    settings = out / "crawl.toml"
    settings.write_text(f"{stored}fetchers = 0\n")
    before = settings.read_bytes()
    r = run_case(Case(["crawl", "--resume", "--out", "OUT", "--no-progress"], 2, ()), out)
    assert r.code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert says in r.stderr, r.stderr
    assert settings.read_bytes() == before


def test_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    """`hostring report --json | head -c 100`: the reader stops early; hostring ends quietly, exit 0."""
    path = tmp_path / "big.sqlite3"
    store = SqliteStore(path)
    f = Frontier(store, WallClock())
    f.discover([Link(f"http://h{i % 50}.example/page/{i}") for i in range(4000)])
    store.flush()
    store.close()
    done = subprocess.run(
        [
            "bash",
            "-c",
            f'"{sys.executable}" -m hostring_cli report --store sqlite:///{path} --dispositions '
            '| head -c 100 >/dev/null; echo "${PIPESTATUS[0]}"',
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == "0", done
    assert done.stderr == "", done.stderr


def test_a_crawl_directory_in_use_is_refused(tmp_path: Path) -> None:
    """A second `hostring crawl --resume` on an OUT another crawl is running in would hand that crawl's leases
    back: it is refused, naming the holder, and changes nothing."""
    out = tmp_path / "out"
    out.mkdir()
    SqliteStore(out / "frontier.sqlite3").close()
    with (out / ".lock").open("a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242")
        held.flush()
        before = sorted(p.name for p in out.iterdir())
        r = run_case(Case(["crawl", "--resume", "--out", "OUT"], 2, ()), out)
    assert r.code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "being crawled by another hostring crawl (pid 4242)" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == before


def test_only_redis_commands_import_redis(tmp_path: Path) -> None:
    """The Redis failures above are caught without the CLI importing redis up front: a process that does not use
    Redis (a crawl, its SQLite node and its worker) never loads it (0.1-0.3 s of every start)."""
    probe = (
        "import sys\n"
        "import hostring_cli.cli, hostring_cli.crawl, frontier_node.server, fetch_worker.worker\n"
        "from frontier_node.store.open import open_store\n"
        "open_store(sys.argv[1]).close()\n"
        "print('redis' in sys.modules)\n"
    )
    store = f"sqlite:///{tmp_path / 'node.sqlite3'}"
    out = subprocess.run([sys.executable, "-c", probe, store], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
