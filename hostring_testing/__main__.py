"""python -m hostring_testing: serve a random (or the sample) web on loopback and print its origins."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from pathlib import Path

from hostring_testing.samples import random_web, sample_oracle, sample_web
from hostring_testing.server import LocalWeb


def _interrupt(signum: int, frame: object) -> None:
    """Turn SIGTERM into KeyboardInterrupt so the `with LocalWeb` block unwinds."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """python -m hostring_testing: serve a random (or the sample) web and print its origins."""
    ap = argparse.ArgumentParser(prog="python -m hostring_testing", description=main.__doc__)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--origins", type=int, default=6)
    ap.add_argument("--pages", type=int, default=20, help="pages per origin")
    ap.add_argument("--sample", action="store_true", help="serve the demo web instead of a random one")
    ap.add_argument("--port", type=int, default=0, help="shared port (0: pick a free one)")
    ap.add_argument("--log", type=Path, default=None, help="append every request as a JSON line")
    args = ap.parse_args(argv)
    # A background job may start with SIGINT ignored; Ctrl-C and SIGTERM both stop the web cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    if args.sample:
        sites, oracle = sample_web(), sample_oracle()
    else:
        sites, oracle = random_web(args.seed, origins=args.origins, pages_per_origin=args.pages)
    with contextlib.suppress(KeyboardInterrupt), LocalWeb(sites, port=args.port, log_path=args.log) as web:
        for label, origin in web.origins.items():
            print(f"{label}\t{origin}", flush=True)
        print("seeds:\t" + " ".join(oracle.seed_urls(web)), flush=True)
        print(f"a correct crawler fetches {len(oracle.reachable_allowed)} pages; Ctrl-C to stop", flush=True)
        while True:
            time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
