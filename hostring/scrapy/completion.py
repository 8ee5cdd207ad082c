"""When each lease is completed, and what the spider sees meanwhile.

The scheduler builds every request it hands out, so it gives each one the Completer's callback and errback and
keeps the spider's own in the request's Handout; two signals time the download and read the response
(request_reached_downloader, response_received). The wrappers put the spider's callback and errback back on
the request and call them through Scrapy's own dispatch (`engine.scraper.call_spider_async`), so a default
`parse`, CrawlSpider rules, coroutine and async-generator callbacks and a missing errback behave as without
hostring. Then:

- a 2xx page goes to the spider; the requests its callback yields are tagged with the page (meta PARENT_KEY),
  pass the spider middlewares and the engine's checks as usual, and reach Scheduler.enqueue_request, which
  keeps them for the page's Complete. That Complete is sent when Scrapy is done with the response (the task
  that called the callback has ended), so it carries every link, and the node admits them in the same
  transaction that marks the page fetched: a process killed at any moment loses none. (A duplicate body's
  links are dropped by the node, as for the fetch worker.)
- anything else is completed as soon as it reaches the callback or errback, and the spider sees it only when
  hostring is done with it: a redirect hostring follows (the target is a new item carrying the same request),
  a status or error hostring will retry, and a lease that went stale never reach the spider; a 404 or a
  download that failed for good do (HttpError, errback), as with Scrapy's own retry middleware giving up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from inspect import isasyncgenfunction, iscoroutinefunction
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from scrapy import Request, Spider
from scrapy.http import Response
from scrapy.utils.defer import ensure_awaitable
from scrapy.utils.misc import warn_on_generator_with_return_value
from scrapy.utils.spider import iterate_spider_output
from twisted.python.failure import Failure

from hostring.scrapy.codec import META_KEY, PARENT_KEY, RequestNotSerializable, encode
from hostring.scrapy.outcome import error_outcome, response_outcome
from hostring.scrapy.session import FrontierSession, Lease
from hostring.v1 import frontier_pb2 as pb

if TYPE_CHECKING:
    from scrapy.core.scraper import Scraper
    from scrapy.crawler import Crawler

log = logging.getLogger("hostring.scrapy")

_INT32 = (-(2**31), 2**31 - 1)
_RETRY_STATES = frozenset({"retryable", "scheduled"})
_CREDENTIAL_HEADERS = (b"Authorization", b"Cookie")


@dataclass(eq=False)
class Handout:
    """What rides in request.meta["hostring"] of a request hostring handed out: its lease, the spider's own
    callback and errback, and who settles it."""

    lease: Lease
    completer: Completer
    callback: Callable[..., Any] | None = None
    errback: Callable[..., Any] | None = None
    downloaded: pb.Outcome | None = None
    """The outcome of the response the downloader returned (response_received), if one came."""
    outcome: pb.Outcome | None = None
    """The outcome of a 2xx page while the spider works on it (its Complete waits for the spider's output)."""
    captured: list[Request] = field(default_factory=list)
    known: int = 0
    """Requests the spider yielded from this page that this process had given hostring before."""
    overdue: asyncio.TimerHandle | None = None

    @property
    def awaiting_output(self) -> bool:
        return self.outcome is not None


async def _awaited(output: Any) -> AsyncIterator[Any]:
    """The items of a spider's output that may have to be awaited first: Scrapy's dispatch (call_spider_async), or
    what iterate_spider_output made of an odd callback's result (an async generator, a Deferred of an iterable)."""
    result = await ensure_awaitable(output)
    if isinstance(result, AsyncIterator):
        async for out in result:
            yield out
    else:
        for out in result:
            yield out


def handout_of(request: Request | None) -> Handout | None:
    """The Handout of a request this process leased (None for anything else)."""
    if request is None:
        return None
    value = request.meta.get(META_KEY)
    return value if isinstance(value, Handout) else None


def hostring_priority(scrapy_priority: int) -> int:
    """Scrapy: higher is sooner; hostring: lower is sooner (int32 on the wire)."""
    return max(_INT32[0], min(_INT32[1], -scrapy_priority))


class Completer:
    """Completes leases for one Scheduler: the callback and errback of every page it hands out, and the
    signals that time and read their downloads."""

    def __init__(
        self,
        crawler: Crawler,
        spider: Spider,
        session: FrontierSession,
        *,
        simhash: bool,
        output_timeout_s: float,
        remember: Callable[[str], None],
        known: Callable[[str], bool],
    ) -> None:
        self.crawler = crawler
        self.spider = spider
        self.session = session
        self.simhash = simhash
        self.output_timeout_s = output_timeout_s
        self._remember = remember
        self._known = known

    def _stat(self, key: str, count: int = 1) -> None:
        self.crawler.stats.inc_value(key, count)

    def arm(self, request: Request, handout: Handout) -> None:
        """Make `request` (built from a lease) come back here: the spider's callback and errback go to the
        handout, the Completer's take their place."""
        handout.callback, handout.errback = request.callback, request.errback
        request.callback, request.errback = self.callback, self.errback
        request.meta[META_KEY] = handout

    def disarm(self, request: Request, handout: Handout) -> None:
        """Give `request` the spider's callback and errback back (the spider sees its own; payloads name them)."""
        if request.callback == self.callback:
            request.callback = handout.callback
        if request.errback == self.errback:
            request.errback = handout.errback

    # ------------------------------------------------------------------ signals

    def reached_downloader(self, request: Request) -> None:
        """request_reached_downloader: the download of a leased request starts (for its timing)."""
        handout = handout_of(request)
        if handout is not None:
            handout.lease.started = time.monotonic()

    def response_received(self, response: Response, request: Request) -> None:
        """response_received: what the Complete will say of a page's download, read as the downloader returned
        it (after the downloader middlewares: decompressed), before any spider middleware."""
        handout = handout_of(request)
        if handout is None or handout.lease.item.kind == pb.ROBOTS:
            return
        elapsed = _elapsed(handout.lease, request)
        handout.downloaded = response_outcome(response, elapsed, robots=False, simhash=self.simhash)

    # ------------------------------------------------------------------ the callback and the errback

    def callback(self, response: Response, **cb_kwargs: Any) -> Iterable[Any] | AsyncIterator[Any]:
        """Request.callback of every page hostring hands out (see the module docstring). A plain function, so
        that it runs in the task that will process its output to the end."""
        request = response.request
        handout = handout_of(request)
        if request is None or handout is None:
            raise RuntimeError(f"hostring.scrapy's callback was given {response!r}, which hostring did not hand out")
        self.disarm(request, handout)
        outcome = handout.downloaded or response_outcome(
            response, _elapsed(handout.lease, request), robots=False, simhash=self.simhash
        )
        if handout.lease.completing or not 200 <= response.status < 300:
            return self._settled_output(handout, response, request, outcome)
        in_task = self._await_output(handout, outcome)
        return self._page_output(handout, response, request, finish_at_end=not in_task)

    async def errback(self, failure: Failure) -> Iterable[Any] | AsyncIterator[Any] | None:
        """Request.errback of every request hostring hands out: complete the lease with the failure (or with the
        response a spider middleware refused, e.g. HttpError), then hand it to the spider's errback unless
        hostring retries or redirects it. Without an errback of the spider's, the failure is raised again, and
        Scrapy handles it as it would have (logs it, or HttpErrorMiddleware ignores the response)."""
        request: Request | None = getattr(failure, "request", None)
        handout = handout_of(request)
        if request is None or handout is None:
            failure.raiseException()
            return None  # pragma: no cover - raiseException always raises
        self.disarm(request, handout)
        if not (handout.lease.completing or handout.awaiting_output):
            outcome = handout.downloaded or error_outcome(
                failure.value or Exception("?"), _elapsed(handout.lease, request)
            )
            if await self._settle(handout, request, outcome):
                return None
        return await self._scraper().call_spider_async(failure, request)

    def _scraper(self) -> Scraper:
        engine = self.crawler.engine
        if engine is None:
            raise RuntimeError("hostring.scrapy: the crawler has no engine")
        return engine.scraper

    def _spider_output(self, response: Response, request: Request) -> AsyncIterator[Any]:
        """What the spider's own callback makes of `response`, through Scrapy's dispatch."""
        return _awaited(self._scraper().call_spider_async(response, request))

    async def _settled_output(
        self, handout: Handout, response: Response, request: Request, outcome: pb.Outcome
    ) -> AsyncIterator[Any]:
        """A non-2xx response a spider takes in its callback (handle_httpstatus_list, ...): completed first; the
        spider sees it only if hostring neither retries nor redirects it."""
        if not handout.lease.completing and await self._settle(handout, request, outcome):
            return
        async for out in self._spider_output(response, request):
            yield out

    async def _settle(self, handout: Handout, request: Request, outcome: pb.Outcome) -> bool:
        """Complete a lease now (with its redirect target as a link); whether the spider must not see it."""
        lease = handout.lease
        links = [self._redirect_link(lease, request, outcome)] if outcome.location else []
        resp = await self.session.complete(lease, outcome, links)
        if resp is None or not resp.accepted:
            why = "stale"
        elif resp.state in _RETRY_STATES:
            why = "retry"
        elif links:
            why = "redirect"
        else:
            return False
        self._stat(f"hostring/withheld/{why}")
        log.debug("hostring takes over %s (%s)", request.url, why)
        return True

    def replaced(self, handout: Handout, request: Request) -> None:
        """A downloader middleware turned a leased download into a request for another URL (which is Discovered
        as any other): the lease ends here, as `ignored`, so that its host is not held for ever."""
        self.disarm(request, handout)
        self._stat("hostring/complete/replaced")
        detail = f"a downloader middleware replaced it with {request.url}"[:500]
        outcome = pb.Outcome(error_class="ignored", error_detail=detail, retry_after_s=-1)
        self.session.spawn(self.session.complete(handout.lease, outcome), "hostring-complete")

    # ------------------------------------------------------------------ a 2xx page's output

    def _await_output(self, handout: Handout, outcome: pb.Outcome) -> bool:
        """Hold a 2xx page's Complete until Scrapy is done with the response: the task running this callback
        goes on to send each output through the spider middlewares to the engine, and ends after the last.
        False if there is no such task (the Complete then follows the callback's last output)."""
        handout.outcome = outcome
        loop = asyncio.get_running_loop()
        handout.overdue = loop.call_later(self.output_timeout_s, self._overdue, handout)
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - Scrapy calls every callback from a task
            return False
        task.add_done_callback(lambda _: self.finish_output(handout))
        return True

    def _page_output(
        self, handout: Handout, response: Response, request: Request, *, finish_at_end: bool
    ) -> Iterable[Any] | AsyncIterator[Any]:
        """A 2xx page's output, each request it yields tagged with the page. A spider callback that returns a plain
        iterable (a generator, a list) is called here, as Scrapy's dispatch would call it, and its output goes back
        as a plain generator: Scrapy then keeps its synchronous output path, where an async one costs futures and
        queue hand-offs for every request yielded (30+ per page on a link-heavy site). Anything else (no callback
        of its own, a coroutine, an async generator) goes through Scrapy's dispatch as it is."""
        callback = request.callback
        if callback is not None and not (iscoroutinefunction(callback) or isasyncgenfunction(callback)):
            warn_on_generator_with_return_value(self.spider, callback)
            output = iterate_spider_output(callback(response, **request.cb_kwargs))
            if isinstance(output, Iterable):
                return self._tagged(handout, output, finish_at_end=finish_at_end)
            return self._tagged_async(handout, _awaited(output), finish_at_end=finish_at_end)
        return self._tagged_async(handout, self._spider_output(response, request), finish_at_end=finish_at_end)

    def _tagged(self, handout: Handout, output: Iterable[Any], *, finish_at_end: bool) -> Iterator[Any]:
        try:
            for out in output:
                if isinstance(out, Request):
                    out.meta[PARENT_KEY] = handout
                yield out
        finally:
            if finish_at_end:  # pragma: no cover - see _await_output
                asyncio.get_running_loop().call_soon(self.finish_output, handout)

    async def _tagged_async(
        self, handout: Handout, output: AsyncIterator[Any], *, finish_at_end: bool
    ) -> AsyncIterator[Any]:
        try:
            async for out in output:
                if isinstance(out, Request):
                    out.meta[PARENT_KEY] = handout
                yield out
        finally:
            if finish_at_end:  # pragma: no cover - see _await_output
                asyncio.get_running_loop().call_soon(self.finish_output, handout)

    def capture(self, handout: Handout, request: Request) -> bool:
        """Keep a request the spider yielded from a 2xx page (it passed the spider middlewares and the engine's
        request_scheduled checks) for that page's Complete. A URL this process already gave hostring is not
        sent again (False: Scrapy counts it as dropped, like a duplicate): navigation repeats on every page."""
        if self._known(request.url):
            handout.known += 1
            return False
        handout.captured.append(request)
        return True

    def finish_output(self, handout: Handout) -> None:
        """Scrapy is done with a 2xx page: complete its lease with the links its callback yielded."""
        outcome = handout.outcome
        if outcome is None:
            return
        handout.outcome = None
        if handout.overdue is not None:
            handout.overdue.cancel()
        if handout.known:
            self._stat("hostring/discover/known", handout.known)
        links: list[pb.Link] = []
        for request in handout.captured:
            try:
                links.append(self.link_for(request, source=handout.lease.item.fetch_key))
            except RequestNotSerializable as e:
                log.error("hostring cannot carry a request, dropping it: %s", e)
                self._stat("hostring/discover/unserializable")
        handout.captured = []
        self.session.spawn(self._complete_page(handout.lease, outcome, links), "hostring-complete")

    async def _complete_page(self, lease: Lease, outcome: pb.Outcome, links: list[pb.Link]) -> None:
        resp = await self.session.complete(lease, outcome, links)
        self._stat("hostring/complete/links_sent", len(links))
        if resp is None or not resp.accepted:
            return
        self._stat("hostring/complete/links_admitted", resp.admitted)
        if links and not resp.follow_links:
            self._stat(f"hostring/complete/links_dropped/{resp.reason or 'not_followed'}", len(links))
            return
        for link in links:
            self._remember(link.observed)

    def _overdue(self, handout: Handout) -> None:
        if handout.awaiting_output:
            log.warning(
                "the spider's output for %s did not end within %.0f s: completing its lease without the links",
                handout.lease.item.url,
                self.output_timeout_s,
            )
            self._stat("hostring/complete/output_timeout")
            handout.captured = []
            self.finish_output(handout)

    # ------------------------------------------------------------------ links

    def link_for(self, request: Request, *, source: str = "") -> pb.Link:
        """A request as a Link: its URL, Scrapy depth and priority, seed flag, and the serialised request."""
        meta = request.meta
        return pb.Link(
            observed=request.url,
            source_key=source,
            depth=max(0, int(meta.get("depth", 0))),
            priority=hostring_priority(request.priority),
            seed=bool(meta.get("is_start_request")),
            payload=encode(request, self.spider),
        )

    def _redirect_link(self, lease: Lease, request: Request, outcome: pb.Outcome) -> pb.Link:
        """The redirect target as a hop hostring schedules: same depth, the request's callback and meta."""
        item, location = lease.item, outcome.location
        payload = item.payload
        target = urljoin(item.url, location)
        to_get = outcome.status in (301, 302, 303) and request.method not in ("GET", "HEAD")
        leaks = urlsplit(target).netloc != urlsplit(item.url).netloc and any(
            h in request.headers for h in _CREDENTIAL_HEADERS
        )
        if to_get or leaks:
            # As Scrapy's RedirectMiddleware: 301/302/303 turn a POST into a GET without body; credentials do
            # not follow a redirect to another host.
            hop = request.replace(method="GET", body=b"") if to_get else request.replace()
            for name in (b"Content-Type", b"Content-Length") if to_get else ():
                hop.headers.pop(name, None)
            if leaks:
                for name in _CREDENTIAL_HEADERS:
                    hop.headers.pop(name, None)
            with contextlib.suppress(RequestNotSerializable):
                payload = encode(hop, self.spider)
        return pb.Link(
            observed=location,
            base_url=item.url,
            source_key=item.fetch_key,
            depth=item.depth,
            redirect_hops=item.redirect_hops + 1,
            priority=hostring_priority(request.priority),
            payload=payload,
        )


def _elapsed(lease: Lease, request: Request) -> float:
    if lease.started:
        return time.monotonic() - lease.started
    return float(request.meta.get("download_latency", 0.0))
