"""The operator's commands as operators run them: `hostring hosts`, `report`, `status` and `--help`, as processes.

Servers are real `hostring node` / `hostring coordinator` processes on loopback; every command is a subprocess
whose exit code, table and JSON are checked. Nothing here contacts a host outside 127.0.0.0/8: the
`*.example` hosts are only queued, never fetched (no worker runs in those tests).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from hostring.domains import registrable_domain
from hostring.logs import JsonFormatter
from hostring.membership import ring_from_proto
from hostring.v1 import coordinator_pb2 as cpb
from hostring.v1 import coordinator_pb2_grpc as cpb_grpc
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from hostring_cli.cli import build_parser
from hostring_testing import LocalWeb, sample_oracle, sample_web
from hostring_testing.crawls import (
    UA,
    CrawlProcess,
    crawl_cmd,
    hostring_cmd,
    journal,
    load_report,
    scope_file,
    serve,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TOKEN = "ops-test-token-abcdef0123456789"
HOSTS = ("a.example", "b.example", "www.b.example")


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A `hostring` command to its end; stdout and stderr captured."""
    full_env = {k: v for k, v in os.environ.items() if k != "HOSTRING_ADMIN_TOKEN"}
    full_env.update(env or {})
    return subprocess.run(
        hostring_cmd(*args), capture_output=True, text=True, timeout=timeout, check=False, env=full_env
    )


def ok(*args: str, env: dict[str, str] | None = None) -> str:
    done = run(*args, env=env)
    assert done.returncode == 0, f"hostring {' '.join(args)} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def seed_hosts(address: str) -> None:
    """Queue a page on each of HOSTS (two on a.example) so the node has hosts to show."""
    urls = ["http://a.example/", "http://a.example/2", "http://b.example/", "http://www.b.example/"]
    with grpc.insecure_channel(address) as channel:
        pb_grpc.FrontierStub(channel).Discover(  # type: ignore[no-untyped-call]
            pb.DiscoverRequest(links=[pb.Link(observed=u, seed=True) for u in urls]), timeout=10
        )


def get_host(address: str, host: str) -> pb.HostInfo:
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.FrontierStub(channel).GetHost(pb.GetHostRequest(host=host), timeout=10)  # type: ignore[no-untyped-call,no-any-return]


# ============================================================================================== hosts


def test_hosts_commands_against_a_node(tmp_path: Path, processes: list[CrawlProcess]) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    node, port = serve(
        [
            "node",
            "--store",
            f"sqlite:///{tmp_path / 'n.sqlite3'}",
            "--listen",
            "127.0.0.1:0",
            "--id",
            "node-ops",
            "--admin-token-file",
            str(token_file),
        ],
        tmp_path,
        "node",
    )
    processes.append(node)
    addr = f"127.0.0.1:{port}"
    seed_hosts(addr)

    table = ok("hosts", "list", "--node", addr).splitlines()
    assert table[0].split()[:4] == ["host", "queued", "flight", "conc"]
    assert [line.split()[0] for line in table[1:]] == ["a.example", "b.example", "www.b.example"]  # deepest first
    listed = json.loads(ok("hosts", "list", "--node", addr, "--json", "--limit", "1"))["hosts"]
    assert [h["host"] for h in listed] == ["a.example"] and listed[0]["node"] == addr
    assert len(json.loads(ok("hosts", "list", "--node", addr, "--with-work", "--json"))["hosts"]) == 3

    shown = ok("hosts", "show", "http://a.example/some/page", "--node", addr)
    fields = dict(line.split(None, 1) for line in shown.splitlines() if not line.startswith(" "))
    assert fields["host"] == "a.example" and fields["paused"] == "no" and "robots" in fields

    # Administrative calls: refused without the token or with a wrong one, accepted with it (file or env).
    refused = run("hosts", "pause", "a.example", "--node", addr)
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr and "authorization" in refused.stderr
    wrong = run("hosts", "pause", "a.example", "--node", addr, env={"HOSTRING_ADMIN_TOKEN": "nope"})
    assert wrong.returncode == 1 and "wrong admin token" in wrong.stderr
    assert not get_host(addr, "a.example").paused
    paused = ok("hosts", "pause", "a.example", "--node", addr, "--admin-token-file", str(token_file))
    assert "paused        yes" in paused and get_host(addr, "a.example").paused
    resumed = json.loads(
        ok("hosts", "resume", "a.example", "--node", addr, "--json", env={"HOSTRING_ADMIN_TOKEN": TOKEN})
    )
    assert resumed["paused"] is False and not get_host(addr, "a.example").paused
    policy = json.loads(
        ok(
            "hosts",
            "policy",
            "b.example",
            "--node",
            addr,
            "--delay",
            "2.5",
            "--concurrency",
            "2",
            "--json",
            env={"HOSTRING_ADMIN_TOKEN": TOKEN},
        )
    )
    assert (policy["min_delay_s"], policy["concurrency"]) == (2.5, 2)
    only_delay = json.loads(
        ok(
            "hosts",
            "policy",
            "b.example",
            "--node",
            addr,
            "--delay",
            "0.5",
            "--json",
            env={"HOSTRING_ADMIN_TOKEN": TOKEN},
        )
    )
    assert (only_delay["min_delay_s"], only_delay["concurrency"]) == (0.5, 2), "flags not given stay as they are"
    assert run("hosts", "policy", "b.example", "--node", addr).returncode != 0  # nothing to set
    missing = run("hosts", "show", "nowhere.example", "--node", addr)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr

    # The node's log is JSON lines, with the node id and, once known, the run id.
    node.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert node.wait(30) == 0, node.output()
    lines = [json.loads(line) for line in node.stderr().splitlines() if line.startswith("{")]
    assert lines and all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)
    assert all(line.get("node") == "node-ops" for line in lines)
    assert lines[-1]["msg"] == "stopping node" and len(lines[-1]["run_id"]) >= 8


def test_json_formatter_carries_exceptions() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("hostring.test.json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("it failed: %s", "details")
    finally:
        logger.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert line["level"] == "ERROR" and line["msg"] == "it failed: details" and line["logger"] == "hostring.test.json"
    assert "Traceback" in line["exc"] and "ValueError: boom" in line["exc"]
    assert line["ts"].endswith("Z")


# ============================================================================================== status, via the ring


def test_status_and_hosts_through_the_coordinator(
    tmp_path: Path, empty_redis: str, processes: list[CrawlProcess]
) -> None:
    coord, coord_port = serve(
        ["coordinator", "--listen", "127.0.0.1:0", "--heartbeat-timeout", "5"], tmp_path, "coordinator"
    )
    processes.append(coord)
    coord_addr = f"127.0.0.1:{coord_port}"
    ports = {}
    for node_id, host in (("node-1", "127.0.0.3"), ("node-2", "127.0.0.1")):
        # No --advertise: a node registers at its --listen address (with the port it bound).
        proc, ports[node_id] = serve(
            ["node", "--coordinator", coord_addr, "--id", node_id, "--store", empty_redis, "--listen", f"{host}:0"],
            tmp_path,
            node_id,
        )
        processes.append(proc)

    def ring() -> cpb.RingState:
        with grpc.insecure_channel(coord_addr) as ch:
            return cpb_grpc.CoordinatorStub(ch).GetRing(cpb.GetRingRequest(), timeout=5)  # type: ignore[no-untyped-call,no-any-return]

    wait_until(lambda: len(ring().members) == 2, 20, "both nodes in the ring")
    addresses = {m.node_id: m.address for m in ring().members}
    assert addresses == {"node-1": f"127.0.0.3:{ports['node-1']}", "node-2": f"127.0.0.1:{ports['node-2']}"}
    ok("seed", "--coordinator", coord_addr, *(f"http://{h}/" for h in HOSTS))

    text = ok("status", "--coordinator", coord_addr).splitlines()
    assert text[0].startswith("ring epoch ") and text[0].endswith("2 node(s)")
    assert text[1].split()[:3] == ["node", "address", "w"]
    assert sorted(line.split()[0] for line in text[2:]) == ["node-1", "node-2"]
    assert all(" yes " in line for line in text[2:]), text
    status = json.loads(ok("status", "--coordinator", coord_addr, "--json"))
    assert status["ring_epoch"] == ring().epoch and sum(n["hosts"] for n in status["nodes"]) == len(HOSTS)

    # --coordinator instead of --node: each host is answered by the owner of its registrable domain.
    current = ring_from_proto(ring())
    listed = json.loads(ok("hosts", "list", "--coordinator", coord_addr, "--json"))["hosts"]
    assert sorted(h["host"] for h in listed) == sorted(HOSTS)
    for h in listed:
        owner = current.owner(registrable_domain(h["host"]))
        assert owner is not None and h["node"] == owner.address
    table = ok("hosts", "list", "--coordinator", coord_addr).splitlines()
    assert table[0].split()[:2] == ["host", "node"]
    shown = json.loads(ok("hosts", "show", "www.b.example", "--coordinator", coord_addr, "--json"))
    assert shown["domain"] == "b.example"
    assert shown["node"] == current.owner("b.example").address  # type: ignore[union-attr]


# ============================================================================================== a standalone node


def test_a_standalone_node_is_seeded_worked_and_reported_from_the_cli(
    tmp_path: Path, processes: list[CrawlProcess]
) -> None:
    """`hostring node` alone, then `seed --node`, `worker --node --until-drained --out`, `report --node`: the
    loopback web is crawled; a coordinator command pointed at the node says it is not a coordinator."""
    with LocalWeb(sample_web()) as web:
        scope = scope_file(web, tmp_path / "scope.txt")
        node, port = serve(
            ["node", "--store", f"sqlite:///{tmp_path / 'n.sqlite3'}", "--listen", "127.0.0.1:0", "--delay", "0.05",
             "--scope", str(scope), "--max-pages-per-host", "60", "--max-depth", "12"],
            tmp_path,
            "node",
        )  # fmt: skip
        processes.append(node)
        addr = f"127.0.0.1:{port}"
        seeded = ok("seed", "--node", addr, *sample_oracle().seed_urls(web))
        assert seeded.startswith(f"seeded node {addr}: admitted ")
        wrong = run("seed", "--coordinator", addr, "http://a.example/")
        assert wrong.returncode == 1 and f"give --node {addr}" in wrong.stderr, wrong.stderr
        worker = run(
            "worker", "--node", addr, "--until-drained", "--allow-network", "127.0.0.0/8", "--user-agent", UA,
            "--out", str(tmp_path / "warc"), timeout=90,
        )  # fmt: skip
        assert worker.returncode == 0, worker.stderr
        report = json.loads(ok("report", "--node", addr, "--json"))
        assert report["by_state"]["fetched"] > 10 and report["unresolved"]["count"] == 0, report["by_state"]
        assert list((tmp_path / "warc").glob("*.warc.gz"))
        bare = run("worker", "--node", addr, "--until-drained")  # the crawl is drained: it ends at once
        assert bare.returncode == 0 and "no --out: fetched pages are not kept" in bare.stderr, bare.stderr


# ============================================================================================== report


def test_report_from_store_agrees_with_report_json(tmp_path: Path, processes: list[CrawlProcess]) -> None:
    with LocalWeb(sample_web()) as web:
        out = tmp_path / "crawl"
        cmd = crawl_cmd(
            sample_oracle().seed_urls(web),
            out,
            delay=0.05,
            scope=scope_file(web, tmp_path / "s.txt"),
            extra=["--max-pages-per-host", "60", "--max-depth", "12"],
        )
        crawl = CrawlProcess(cmd, out, tmp_path / "logs").start()
        processes.append(crawl)
        store = f"sqlite:///{out / 'frontier.sqlite3'}"
        # While the crawl runs, the store can be read (read-only) without disturbing it.
        wait_until(lambda: (out / "frontier.sqlite3").exists() or not crawl.running, 30, "the crawl's store")
        live_reads = 0
        while crawl.running:
            done = run("report", "--store", store, "--json")
            if crawl.running:
                assert done.returncode == 0, done.stderr
                assert json.loads(done.stdout)["journal"]["disagreeing_items"] == 0
                live_reads += 1
            time.sleep(0.2)
        assert crawl.wait(30) == 0, crawl.output()
    live = load_report(out)
    offline: dict[str, Any] = json.loads(ok("report", "--store", store, "--dispositions"))

    # The node stores its Discover verdicts and budget breaches as it goes: the offline report has them too.
    for key in set(live) - {"dispositions", "finish"}:
        assert offline[key] == live[key], key
    assert live["suppressed_by_rule"], "the crawl breaches a budget (--max-depth), so the report lists it"
    assert offline["not_in_store"] == []
    rows = {r["key"]: r for r in offline["dispositions"]}
    assert len(rows) == len(live["dispositions"])
    for row in live["dispositions"]:
        assert {k: v for k, v in rows[row["key"]].items() if k != "leases"} == row
    # Attempts from the journal: one lease event per lease, and fetched pages were leased at least once.
    leases = {k: sum(1 for e in journal(out, event="lease", key=k)) for k in list(rows)[:20]}
    for key, n in leases.items():
        assert rows[key]["leases"] == n
        assert n >= 1 or rows[key]["state"] != "fetched"
    spread = offline["attempts"]["leases_per_identity"]
    assert sum(spread.values()) == sum(1 for r in rows.values() if r["state"] != "rejected")
    assert offline["journal"]["disagreeing_items"] == 0

    summary = ok("report", "--store", store)
    assert summary.startswith(f"run {live['run_id']}: {live['admitted']} admitted URLs = fetched ")
    assert "attempts:" in summary and "journal:" in summary
    print(f"read the store {live_reads} time(s) while the crawl ran")
    bad = run("report", "--store", f"sqlite:///{tmp_path / 'none.sqlite3'}")
    assert bad.returncode == 2 and "no store" in bad.stderr and len(bad.stderr.splitlines()) == 1


# ============================================================================================== help


HELP = {
    "node": [
        "--store",
        "--listen",
        "--coordinator",
        "--tls-cert",
        "--tls-key",
        "--tls-ca",
        "--admin-token-file",
        "--metrics-port",
    ],
    "crawl": ["--out", "--scope", "--allow-network", "--resume", "--metrics-port"],
    "demo": ["--out", "--delay"],
    "coordinator": ["--listen", "--redis", "--tls-cert", "--tls-ca", "--admin-token-file", "--metrics-port"],
    "worker": ["--coordinator", "--allow-network", "--tls-cert", "--tls-key", "--tls-ca", "--metrics-port"],
    "status": ["--coordinator", "--json", "--tls-ca"],
    "seed": ["--coordinator", "--file", "--tls-ca"],
    "report": ["--node", "--store", "--json", "--dispositions", "--tls-ca"],
    "hosts": ["list", "show", "pause", "resume", "policy"],
    "hosts list": ["--node", "--coordinator", "--limit", "--with-work", "--json", "--tls-ca"],
    "hosts show": ["HOST", "--node", "--coordinator", "--json"],
    "hosts pause": ["HOST", "--node", "--admin-token-file"],
    "hosts resume": ["HOST", "--node", "--admin-token-file"],
    "hosts policy": ["HOST", "--delay", "--concurrency", "--admin-token-file"],
    "revisit": ["refetch", "policy"],
    "revisit refetch": ["URL", "--at", "--in", "--node", "--admin-token-file"],
    "revisit policy": [
        "NAME",
        "--domain",
        "--revisit",
        "--revisit-interval",
        "--revisit-min",
        "--revisit-max",
        "--revisit-share",
        "--node",
        "--admin-token-file",
    ],
}
# The revisit flags of crawl and node (a contract: the issue names them).
REVISIT_FLAGS = ["--revisit", "--revisit-interval", "--revisit-min", "--revisit-max", "--revisit-share", "--retention"]
HELP["crawl"] += [*REVISIT_FLAGS, "--duration"]
HELP["node"] += REVISIT_FLAGS


@pytest.mark.parametrize("command", sorted(HELP))
def test_help_of_every_command(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*command.split(), "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for flag in HELP[command]:
        assert flag in text, f"hostring {command} --help does not mention {flag}"


def test_every_command_has_help_listed() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) <= set(HELP), f"commands without a help check: {set(sub.choices) - set(HELP)}"
    top = run("--help")
    assert top.returncode == 0 and "--log-format" in top.stdout and "hosts" in top.stdout
