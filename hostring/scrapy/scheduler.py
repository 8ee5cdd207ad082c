"""`hostring.scrapy.Scheduler`: Scrapy's scheduler interface over hostring's Discover, Lease and Complete.

- enqueue_request: a start request (or one yielded outside a 2xx page's callback, e.g. from an errback) is
  serialised (codec) and Discovered; hostring scopes, dedups and orders it. Scrapy's priority maps to
  hostring's (higher in Scrapy is sooner, lower in hostring is sooner). Refused and duplicate requests fire
  `request_dropped` when their verdict arrives. Requests a 2xx page's callback yields arrive here tagged with
  that page and travel in its Complete instead (completion.py).
- Leases: each leased page is rebuilt from its payload, armed with the Completer's callback and errback (the
  spider's own ride in its Handout), and handed to the engine with `engine.crawl()`, which comes back to
  enqueue_request and waits in `_ready` for `next_request`. A leased robots.txt is fetched with
  `engine.download_async()` (downloader middlewares only, never the spider) and completed with its body.
  Scrapy's Retry, Redirect, MetaRefresh and RobotsTxt middlewares are told to stand aside (meta dont_retry,
  dont_redirect, dont_obey_robotstxt): retries, redirects and robots are hostring's.
- has_pending_requests is true while this process has work, and then until every node stayed drained for
  HOSTRING_DRAIN_GRACE_S (for ever with HOSTRING_WHEN_DRAINED = "wait").

Nothing else needs enabling: `SCHEDULER = "hostring.scrapy.Scheduler"` plus HOSTRING_NODES or
HOSTRING_COORDINATOR is the whole setup.
"""

from __future__ import annotations

import collections
import functools
import logging
import time
from typing import TYPE_CHECKING, Self

from scrapy import Request, Spider, signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.reactor import is_asyncio_reactor_installed
from twisted.internet.defer import Deferred

from hostring.client import Router
from hostring.membership import RingWatcher
from hostring.scrapy.codec import META_KEY, PARENT_KEY, BadPayload, RequestNotSerializable, decode
from hostring.scrapy.completion import Completer, Handout, handout_of
from hostring.scrapy.config import HostringConfigError, PluginConfig, check_crawler_settings
from hostring.scrapy.outcome import error_outcome, response_outcome
from hostring.scrapy.session import FrontierSession, Lease, StaticRing
from hostring.v1 import frontier_pb2 as pb

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

log = logging.getLogger("hostring.scrapy")

_SENT_LIMIT = 1 << 17
_STAND_ASIDE = {"dont_obey_robotstxt": True, "dont_redirect": True, "dont_retry": True}


class Scheduler(BaseScheduler):
    """Scrapy's scheduler over a hostring node or cluster (see the module docstring)."""

    def __init__(self, crawler: Crawler, config: PluginConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.stats = crawler.stats
        self.spider: Spider | None = None
        self.session: FrontierSession | None = None
        self.completer: Completer | None = None
        self._router: Router | None = None
        self._ready: collections.deque[Request] = collections.deque()
        self._incoming: dict[int, Request] = {}
        self._sent: set[str] = set()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        check_crawler_settings(crawler.settings)
        name = crawler.spider.name if crawler.spider is not None else "spider"
        return cls(crawler, PluginConfig.from_settings(crawler.settings, name))

    # ------------------------------------------------------------------ lifecycle

    def open(self, spider: Spider) -> Deferred[None]:
        self.spider = spider
        return deferred_from_coro(self._open(spider))

    async def _open(self, spider: Spider) -> None:
        if not is_asyncio_reactor_installed():
            raise HostringConfigError(
                "hostring.scrapy needs Twisted's asyncio reactor: TWISTED_REACTOR = "
                "'twisted.internet.asyncioreactor.AsyncioSelectorReactor' (Scrapy's default since 2.13)"
            )
        cfg = self.config
        router: Router
        if cfg.coordinator:
            watcher = RingWatcher(cfg.coordinator, tls=cfg.tls)
            await watcher.start(timeout=cfg.connect_timeout_s)
            router = watcher
        else:
            router = StaticRing(cfg.nodes, cfg.tls)
        self._router = router
        self.session = FrontierSession(
            router,
            worker_id=cfg.worker_id,
            capacity=cfg.max_leased,
            on_lease=self._on_lease,
            stat=self._stat,
            lease_wait_s=cfg.lease_wait_s,
            drain_grace_s=cfg.drain_grace_s,
        )
        self.completer = Completer(
            self.crawler,
            spider,
            self.session,
            simhash=cfg.simhash,
            output_timeout_s=cfg.output_timeout_s,
            remember=self._remember,
            known=self._sent.__contains__,
        )
        connect = self.crawler.signals.connect
        connect(self.completer.reached_downloader, signal=signals.request_reached_downloader)
        connect(self.completer.response_received, signal=signals.response_received)
        connect(self._start_leasing, signal=signals.spider_opened)

    def _start_leasing(self) -> None:
        """spider_opened: the engine is ready to crawl, so leases taken now are downloaded at once (none is held,
        its host waiting, while the rest of Scrapy starts)."""
        assert self.session is not None
        self.session.start()
        cfg = self.config
        where = f"coordinator {cfg.coordinator}" if cfg.coordinator else f"node(s) {', '.join(cfg.nodes)}"
        log.info("hostring scheduler %s leasing from %s", cfg.worker_id, where)

    def close(self, reason: str) -> Deferred[None] | None:
        if self.session is None:
            return None
        return deferred_from_coro(self._close())

    async def _close(self) -> None:
        assert self.session is not None and self.completer is not None
        disconnect = self.crawler.signals.disconnect
        disconnect(self.completer.reached_downloader, signal=signals.request_reached_downloader)
        disconnect(self.completer.response_received, signal=signals.response_received)
        disconnect(self._start_leasing, signal=signals.spider_opened)
        self._ready.clear()  # their leases are still open: close() gives them back
        await self.session.close(give_back=True)
        if isinstance(self._router, RingWatcher):
            await self._router.close()

    # ------------------------------------------------------------------ Scrapy's interface

    def has_pending_requests(self) -> bool:
        if self._ready or self._incoming:
            return True
        if self.session is None:
            return False
        if self.session.busy or self.config.when_drained == "wait":
            return True
        return not self.session.finished()

    def enqueue_request(self, request: Request) -> bool:
        if self._incoming.pop(id(request), None) is not None:  # a leased request, handed over by engine.crawl()
            self._ready.append(request)
            return True
        parent = request.meta.get(PARENT_KEY)
        if isinstance(parent, Handout):  # yielded by the callback of a 2xx page this process leased
            if parent.awaiting_output:
                if parent.completer.capture(parent, request):
                    self.stats.inc_value("scheduler/enqueued")
                    self.stats.inc_value("scheduler/enqueued/hostring")
                    return True
                return False
            self._stat("hostring/discover/after_complete", 1)
        else:
            handout = handout_of(request)
            if handout is not None and not handout.lease.completing and not handout.awaiting_output:
                if request.url == handout.lease.item.url:
                    self._ready.append(request)  # a downloader middleware re-scheduled a download it had not finished
                    return True
                handout.completer.replaced(handout, request)
        return self._discover(request)

    def next_request(self) -> Request | None:
        if not self._ready:
            return None
        self.stats.inc_value("scheduler/dequeued")
        self.stats.inc_value("scheduler/dequeued/hostring")
        return self._ready.popleft()

    # ------------------------------------------------------------------ discovering

    def _remember(self, url: str) -> None:
        """A URL hostring has taken: this process need not send it again (navigation repeats on every page)."""
        if len(self._sent) >= _SENT_LIMIT:
            self._sent.clear()
        self._sent.add(url)

    def _discover(self, request: Request) -> bool:
        if self.session is None or self.completer is None:
            raise RuntimeError("hostring.scrapy.Scheduler: enqueue_request before open")
        if request.url in self._sent:  # this process sent the same URL already: hostring has it
            self._stat("hostring/discover/known", 1)
            return False
        try:
            link = self.completer.link_for(request)
        except RequestNotSerializable as e:
            log.error("hostring cannot carry a request, dropping it: %s", e)
            self._stat("hostring/discover/unserializable", 1)
            return False
        self._remember(request.url)
        self.session.discover(link, functools.partial(self._verdict, request))
        self._stat("hostring/discover/sent", 1)
        self.stats.inc_value("scheduler/enqueued")
        self.stats.inc_value("scheduler/enqueued/hostring")
        return True

    def _verdict(self, request: Request, verdict: pb.LinkVerdict | None) -> None:
        if verdict is None:
            self._sent.discard(request.url)
            self._stat("hostring/discover/unrouted", 1)
            log.error("no frontier node took %s: dropped", request.url)
        else:
            name = pb.Verdict.Name(verdict.verdict).lower()
            self._stat(f"hostring/discover/{name}", 1)
            if verdict.reason:
                self._stat(f"hostring/discover/{name}/{verdict.reason}", 1)
            if verdict.verdict == pb.ADMITTED:
                return
        self.crawler.signals.send_catch_log(signal=signals.request_dropped, request=request, spider=self.spider)

    # ------------------------------------------------------------------ leases

    def _on_lease(self, lease: Lease) -> None:
        """Turn a leased item into a Scrapy request and hand it to the engine (robots.txt to the downloader)."""
        assert self.session is not None and self.completer is not None and self.spider is not None
        item, handout = lease.item, Handout(lease, self.completer)
        if item.kind == pb.ROBOTS:
            robots = Request(item.url, callback=NO_CALLBACK, dont_filter=True, meta={META_KEY: handout, **_STAND_ASIDE})
            self.session.spawn(self._fetch_robots(robots, handout), "hostring-robots")
            return
        try:
            request = decode(item.payload, item.url, self.spider)
        except BadPayload as e:
            log.error("hostring leased a request this spider cannot rebuild: %s", e)
            self._stat("hostring/lease/bad_payload", 1)
            self.session.spawn(self._give_back(handout, "bad_payload", str(e)), "hostring-complete")
            return
        request.meta.update({"depth": item.depth, **_STAND_ASIDE})
        self.completer.arm(request, handout)
        engine = self.crawler.engine
        self._incoming[id(request)] = request
        try:
            if engine is None:
                raise RuntimeError("no engine")
            engine.crawl(request)
        except RuntimeError as e:  # the spider closed meanwhile: give the lease back
            log.debug("could not hand %s to the engine: %s", item.url, e)
        if self._incoming.pop(id(request), None) is not None:
            self._stat("hostring/lease/refused_by_engine", 1)
            self.session.spawn(self._give_back(handout, "ignored", "refused by a request_scheduled handler"))

    async def _give_back(self, handout: Handout, error_class: str, detail: str = "") -> None:
        assert self.session is not None
        outcome = pb.Outcome(error_class=error_class, error_detail=detail[:500], retry_after_s=-1)
        await self.session.complete(handout.lease, outcome)

    async def _fetch_robots(self, request: Request, handout: Handout) -> None:
        """robots.txt through Scrapy's downloader (its middlewares apply: User-Agent, proxy, decompression, ...;
        the spider never sees it), completed with its body, or with the error its download ended in."""
        assert self.session is not None
        engine = self.crawler.engine
        started = time.monotonic()
        try:
            if engine is None:
                raise RuntimeError("no engine")
            response = await engine.download_async(request)
        except Exception as e:
            outcome = error_outcome(e, time.monotonic() - started)
        else:
            outcome = response_outcome(response, time.monotonic() - started, robots=True, simhash=False)
        await self.session.complete(handout.lease, outcome)

    def _stat(self, key: str, count: int) -> None:
        self.stats.inc_value(key, count)
