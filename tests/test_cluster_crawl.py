"""A cluster crawl shaped like the one that lost an origin: 100+ origins, a join at a quarter, a SIGKILL at half.

Redis, a coordinator, three nodes and two workers (real processes) crawl a generated web of 100 origins on
loopback addresses (robots files, robots.txt redirects to other origins, cross-origin redirects, same-origin
mirrors), plus mirrors whose twins live on domains that different nodes own at every ring of the run (picked
with the ring math). A fourth node joins when a quarter of the expected requests were served; one of the first
three is SIGKILLed at half. Judged from the web server's own request log against a brute-force BFS that dedups
bodies by exact digest (`oracle_for(..., dedup_bodies=True)`): nothing missing, nothing extra, at most 20
duplicate fetches, no overlapping requests and no pause below the delay on any origin.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from frontier_node.store.redis import RedisStore
from hostring.ring import Member, Ring
from hostring_testing import LocalWeb, random_model, render_model
from hostring_testing.cluster import Cluster, journals, wait_for
from hostring_testing.crawls import TOKEN, politeness_violations, settled_by
from hostring_testing.model import WebModel, mirror_across
from hostring_testing.oracle import oracle_for
from hostring_testing.proc import STARTUP_TIMEOUT_S

ORIGINS = 100
PAGES = 22
MIRRORS = 8
DELAY_S = 0.6
LEASE_S = 5.0
HEARTBEAT_S = 2.0
VICTIM = "n2"
GAP_TOLERANCE_S = 0.05  # see tests/test_cluster.py: a busy machine stamps a response's end late
MAX_DUPLICATES = 20


def ring(*nodes: str) -> Ring:
    return Ring(1, [Member(n, f"{n}:1") for n in nodes])


def web_model() -> tuple[WebModel, list[tuple[str, str]]]:
    """The generated web plus MIRRORS cross-origin twins whose domains have different owners in every ring the
    crawl goes through (n1-n3, n1-n4, and n1-n4 without the victim)."""
    model = random_model(
        2025,
        origins=ORIGINS,
        pages_per_origin=PAGES,
        links_per_page=5,
        unavailable_robots=0,
        trap_fraction=0.0,
        seeds=ORIGINS,
        user_agent=TOKEN,
    )
    # LocalWeb gives origin i the address 127.0.0.(i + 2) (no .0 or .255 in this range): its registrable domain.
    domain = {label: f"127.0.0.{i + 2}" for i, label in enumerate(model.origins)}
    rings = [ring("n1", "n2", "n3"), ring("n1", "n2", "n3", "n4"), ring(*(n for n in ("n1", "n3", "n4")))]
    pairs: list[tuple[str, str]] = []
    used: set[str] = set()
    for a in model.origins:
        for b in model.origins:
            if len(pairs) == MIRRORS or a == b or a in used or b in used:
                continue
            if all(r.owner(domain[a]) != r.owner(domain[b]) for r in rings):
                src, dst, only = mirror_across(model, a, b, tag=f"twin{len(pairs)}")
                if all(model.allowed(k) for k in (src, dst, only, (b, only[1]), (a, "/"))):
                    pairs.append((a, b))
                    used |= {a, b}
                else:  # robots would hide the effect: undo
                    for k in (src, dst, only):
                        del model.pages[k]
                    model.pages[(a, "/")].links.pop()
    assert len(pairs) == MIRRORS
    return model, pairs


def stuck(judge: RedisStore, c: Cluster) -> str:
    """What is left scheduled, leased or retryable in Redis, by domain: fence, rows, robots rows, and each node's
    view of the host."""
    from hostring.v1 import frontier_pb2 as pb

    lines = []
    for d in sorted(judge.all_domains()):
        counts = judge.domain_counts(d)
        if counts.get("scheduled") or counts.get("leased") or counts.get("retryable"):
            items = judge.export_domain(d, journal_tail=0)["items"]
            rows = [
                f"{it['key']} {it['state']} {it['reason']!r} g{it['generation']} a{it['attempt']} host {it['host']} "
                f"source {it['source']!r} deadline {it['deadline'] - time.time():.1f}s"
                for it in items
                if it["state"] in ("scheduled", "leased", "retryable") or it["key"].startswith("robots:")
            ]
            lines.append(f"{d}: {counts} fence {judge.fence(d)}")
            export = judge.export_domain(d)
            (c.log_dir / f"stuck-{d}.json").write_text(json.dumps(export, indent=1))
            first = next(it["key"] for it in items if it["state"] == "scheduled")
            lines += [
                f"    journal of {first}: "
                + "; ".join(
                    f"{j['writer']}@{j['epoch']} {j['entry'][6]} {j['entry'][5]}->{j['entry'][7]} t{j['entry'][8]:.2f}"
                    for j in export["journal"]
                    if j["entry"][2] == first
                )
            ]
            lines.append("    handoffs: " + "; ".join(f"{n} {c.handoffs(n)}" for n in sorted(c.addresses)))
            lines += [f"    {r}" for r in sorted(rows, key=lambda r: not r.startswith("robots:"))[:6]]
            for n in sorted(c.addresses):
                if c.procs[n].running:
                    try:
                        h = c.frontier(n).GetHost(pb.GetHostRequest(host=d), timeout=5)
                        lines.append(f"    on {n}: {str(h).replace(chr(10), '; ')}")
                    except Exception as e:  # NOT_FOUND on nodes that do not hold it
                        lines.append(f"    on {n}: {type(e).__name__}")
    return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.long(40)
@pytest.mark.timeout(240)
def test_cluster_crawl_join_at_a_quarter_kill_at_half(empty_redis: str, tmp_path: Path) -> None:
    model, pairs = web_model()
    oracle = oracle_for(model, dedup_bodies=True)
    # A copy whose links were followed would lead to a page of its own origin that nothing else reaches.
    for i, (_, copy) in enumerate(pairs):
        assert (copy, f"/twin{i}-only") not in oracle.reachable_allowed
    expected = len(oracle.reachable_allowed) + len(oracle.robots_fetches)
    judge = RedisStore(redis.Redis.from_url(empty_redis), node_id="test-judge", epoch=0)
    with (
        LocalWeb(render_model(model, 2025)) as web,
        Cluster(tmp_path, empty_redis, heartbeat_timeout=HEARTBEAT_S, delay=DELAY_S, lease_s=LEASE_S) as c,
    ):
        c.hits_of = lambda: len(web.hits)
        try:
            c.start_coordinator()
            c.start_nodes("n1", "n2", "n3")
            c.wait_settled({"n1", "n2", "n3"}, STARTUP_TIMEOUT_S)
            c.seed(oracle.seed_urls(web))
            c.start_workers("w1", "w2")
            t0 = time.monotonic()
            wait_for(lambda: len(web.hits) >= expected / 4, 90, "a quarter of the crawl")
            c.note("a quarter of the expected requests served: starting n4")
            c.start_nodes("n4")
            c.wait_settled({"n1", "n2", "n3", "n4"}, 30.0)
            c.note("n4 joined")
            wait_for(lambda: len(web.hits) >= expected / 2, 90, "half of the crawl")
            assert len(web.hits) < 0.6 * expected, "the join took so long that the kill comes late"
            c.procs[VICTIM].stop(signal.SIGKILL)
            c.note(f"{VICTIM} SIGKILLed")
            c.wait_settled({"n1", "n3", "n4"}, 30.0)

            def finished() -> bool:
                progress: Counter[str] = Counter()
                for d in judge.all_domains():
                    progress.update(judge.domain_counts(d))
                busy = progress["scheduled"] + progress["leased"] + progress["retryable"]
                return not busy and time.time() - max((h.end for h in web.hits), default=0.0) > 1.0

            try:
                wait_for(finished, 120, "Redis to show nothing scheduled, leased or retryable", interval=0.5)
            except AssertionError as e:
                raise AssertionError(f"{e}\n{stuck(judge, c)}") from None
            c.note(f"crawl finished after {time.monotonic() - t0:.1f}s, {len(web.hits)} requests")
            lines = journals(judge)
        except BaseException:
            print(c.timeline_text())
            print(c.logs())
            raise
        finally:
            judge.client.close()
        print(c.timeline_text())
        verdict = oracle.judge(web.fetched())
        problems = [f"{what}: {sorted(verdict[what])[:8]}" for what in ("missing", "unexpected") if verdict[what]]
        duplicates = sum(n - 1 for _, _, n in web.duplicates(include_robots=True))
        if duplicates > MAX_DUPLICATES:
            problems.append(f"{duplicates} duplicate fetches: {web.duplicates(include_robots=True)[:8]}")

        settled = settled_by(lines)  # robots.txt has another key: no journal, no correction
        for label in web.origins:
            problems += [f"{label}: {v}" for v in politeness_violations(web, label, DELAY_S, GAP_TOLERANCE_S, settled)]
        copies_fetched = sum(1 for _, b in pairs if any(h.label == b and "-copy" in h.path for h in web.hits))
        if copies_fetched != MIRRORS:
            problems.append(f"only {copies_fetched} of the {MIRRORS} cross-node copies were fetched")
        assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems)
