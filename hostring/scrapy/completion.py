"""When and with what each lease is completed, and what the spider sees meanwhile.

The two middlewares call in here:

- a 2xx page goes to the spider first; the requests its callback yields are captured on their way out
  (HostringSpiderMiddleware) and sent inside the lease's Complete, as the fetch worker sends the links it
  extracted. The node admits them in the same transaction that marks the page fetched, so a process killed at
  any moment loses no link: before the Complete the lease expires and the page is fetched again; after it the
  links are stored. (A duplicate body's links are dropped by the node, as for the worker.)
- anything else is completed as soon as it is downloaded, and the spider sees it only when hostring is done
  with it: a redirect hostring follows (the target is a new item carrying the same request), a status or error
  hostring will retry, and a lease that went stale never reach the spider; a 404 or a download that failed
  for good does (HttpError, errback), as with Scrapy's own retry middleware giving up.
- a robots.txt download is completed with its body; it never reaches the spider.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

from scrapy import Request, Spider, signals
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.http.request import NO_CALLBACK
from twisted.python.failure import Failure

from hostring.scrapy.codec import HANDOFF_KEY, META_KEY, RequestNotSerializable, encode
from hostring.scrapy.outcome import error_outcome, response_outcome
from hostring.scrapy.session import FrontierSession, Lease
from hostring.v1 import frontier_pb2 as pb

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

log = logging.getLogger("hostring.scrapy")

_INT32 = (-(2**31), 2**31 - 1)
_RETRY_STATES = frozenset({"retryable", "scheduled"})
_CREDENTIAL_HEADERS = (b"Authorization", b"Cookie")


@dataclass(eq=False)
class Handout:
    """What rides in request.meta["hostring"] of a request hostring handed out: its lease and who settles it."""

    lease: Lease
    completer: Completer
    outcome: pb.Outcome | None = None
    """The outcome of a 2xx page while the spider works on it (its Complete waits for the spider's output)."""
    captured: list[Request] = field(default_factory=list)
    known: int = 0
    """Requests the spider yielded from this page that this process had given hostring before."""
    overdue: asyncio.TimerHandle | None = None

    @property
    def awaiting_output(self) -> bool:
        return self.outcome is not None


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
    """Completes leases for one Scheduler: from the downloader middleware, then from the spider middleware."""

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

    # ------------------------------------------------------------------ downloads (downloader middleware)

    async def on_response(self, handout: Handout, request: Request, response: Response) -> Response | Request:
        """The response for the spider, or a stand-in request when hostring takes the download over."""
        lease = handout.lease
        robots = lease.item.kind == pb.ROBOTS
        outcome = response_outcome(response, _elapsed(lease, request), robots=robots, simhash=self.simhash)
        if not robots and 200 <= response.status < 300:
            handout.outcome = outcome  # completed once the spider's output is known (finish_output)
            handout.overdue = asyncio.get_running_loop().call_later(self.output_timeout_s, self._overdue, handout)
            return response
        links = [] if robots or not outcome.location else [self._redirect_link(lease, request, outcome)]
        resp = await self.session.complete(lease, outcome, links)
        if robots:
            return response
        if resp is None or not resp.accepted:
            return self._handoff(request, "stale")
        if resp.state in _RETRY_STATES:
            return self._handoff(request, "retry")
        if links:
            return self._handoff(request, "redirect")
        return response

    async def on_failure(self, handout: Handout, request: Request, exc: BaseException) -> Request | None:
        """Complete with a download error; None (the errback runs) only once hostring gives up on the URL."""
        lease = handout.lease
        resp = await self.session.complete(lease, error_outcome(exc, _elapsed(lease, request)))
        if lease.item.kind == pb.ROBOTS:
            return None
        if resp is None or not resp.accepted:
            return self._handoff(request, "stale")
        if resp.state in _RETRY_STATES:
            return self._handoff(request, "retry")
        return None

    def _handoff(self, request: Request, why: str) -> Request:
        """The stand-in returned instead of the response: the engine schedules it, Scheduler.enqueue_request
        recognises it and stores nothing, so no callback or errback runs."""
        self._stat(f"hostring/withheld/{why}")
        log.debug("hostring takes over %s (%s)", request.url, why)
        return Request(request.url, callback=NO_CALLBACK, dont_filter=True, meta={HANDOFF_KEY: why})

    # ------------------------------------------------------------------ the spider's output (spider middleware)

    def capture(self, handout: Handout, request: Request) -> None:
        """Keep a request the spider yielded from a 2xx page for that page's Complete, after the checks the
        engine would run (request_scheduled: e.g. OffsiteMiddleware). A URL this process already gave hostring
        is skipped first: navigation repeats on every page, and hostring has it."""
        if self._known(request.url):
            handout.known += 1
            return
        results = self.crawler.signals.send_catch_log(
            signal=signals.request_scheduled, request=request, spider=self.spider, dont_log=IgnoreRequest
        )
        for _, result in results:
            if isinstance(result, Failure) and isinstance(result.value, IgnoreRequest):
                return
        handout.captured.append(request)

    def finish_output(self, handout: Handout) -> None:
        """The spider is done with a 2xx page: complete its lease with the links it yielded."""
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
                self.crawler.signals.send_catch_log(signal=signals.request_dropped, request=request, spider=self.spider)
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
