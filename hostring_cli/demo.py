"""`hostring demo`: serve the built-in sample web on loopback, crawl it, and check the crawl from the server's log."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

from hostring_cli.crawl import CrawlOptions, run_crawl
from hostring_testing import LocalWeb, sample_oracle, sample_web

DEMO_USER_AGENT = "hostring-demo/0.1 (+https://github.com/hostring/hostring)"


def run_demo(out: str = "", delay: float = 0.2, stream: TextIO = sys.stdout) -> int:
    """Crawl the sample web; print the report and what the web servers saw. 0 when the server log agrees."""
    out_dir = Path(out) if out else Path(tempfile.mkdtemp(prefix="hostring-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    with LocalWeb(sample_web(), log_path=out_dir / "server-log.jsonl") as web:
        oracle = sample_oracle("hostring-demo")
        hosts = sorted({urlsplit(o).hostname or "" for o in web.origins.values()})
        scope_file = out_dir / "scope.txt"
        scope_file.write_text("\n".join(hosts) + "\n", encoding="utf-8")
        print(f"sample web: {', '.join(f'{label} {origin}' for label, origin in web.origins.items())}", file=stream)
        opts = CrawlOptions(
            seeds=oracle.seed_urls(web),
            out=out_dir / "crawl",
            scope="list",
            scope_file=scope_file,
            allow_network=["127.0.0.0/8"],
            delay=delay,
            user_agent=DEMO_USER_AGENT,
            max_pages_per_host=60,
            max_depth=12,
        )
        code = run_crawl(opts, stream)
        if code != 0:
            return code
        fetched = web.fetched()
        missing = oracle.reachable_allowed - fetched
        forbidden = fetched & oracle.disallowed
        dups = web.duplicates()
        worst = max(web.max_concurrency(o) for o in web.origins.values())
        robots = {k for k in fetched if k[1] == "/robots.txt"}
        trapped = {k for k in fetched - robots if oracle.in_trap(k)}
        expected = fetched & oracle.reachable_allowed
        other = fetched - robots - trapped - expected
        print("\nwhat the web servers saw:", file=stream)
        print(
            f"  requests {len(web.hits)}: {len(expected)} of the {len(oracle.reachable_allowed)} pages a correct "
            f"crawler fetches, {len(trapped)} in crawler traps (ended by --max-depth and the per-host budget), "
            f"{len(robots)} robots.txt" + (f", {len(other)} other" if other else ""),
            file=stream,
        )
        print(
            f"  missed {len(missing)}, robots-forbidden fetched {len(forbidden)}, fetched twice {len(dups)}, "
            f"most requests at once on one origin {worst}",
            file=stream,
        )
        print(f"  server log: {out_dir / 'server-log.jsonl'}", file=stream)
        return 0 if not missing and not forbidden and not dups and worst <= 1 else 1
