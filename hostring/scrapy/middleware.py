"""The plug-in's two middlewares: they complete each lease (the logic lives in completion.py).

- DownloaderMiddleware (585): between HttpCompressionMiddleware (590, so the body it digests is decoded) and
  MetaRefreshMiddleware (580): it sees responses after decompression and before anything could turn them
  into new requests, and every download error.
- SpiderMiddleware (5): closest to the engine, it takes the requests a callback yields from a 2xx page
  (after Depth, Referer and the other spider middlewares) for that page's Complete.

Requests and responses hostring did not hand out pass through both untouched.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Self

from scrapy import Request
from scrapy.http import Response

from hostring.scrapy.completion import handout_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


class DownloaderMiddleware:
    """Completes hostring leases from their download: status, timings, digest, redirect target or error class."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls()

    def process_request(self, request: Request) -> None:
        handout = handout_of(request)
        if handout is not None and not handout.lease.started:
            handout.lease.started = time.monotonic()

    async def process_response(self, request: Request, response: Response) -> Response | Request:
        handout = handout_of(request)
        if handout is None or handout.lease.completing or handout.awaiting_output:
            return response
        return await handout.completer.on_response(handout, request, response)

    async def process_exception(self, request: Request, exception: Exception) -> Response | Request | None:
        handout = handout_of(request)
        if handout is None or handout.lease.completing or handout.awaiting_output:
            return None
        return await handout.completer.on_failure(handout, request, exception)


class SpiderMiddleware:
    """Sends the requests a callback yields from a 2xx page inside that page's Complete."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls()

    async def process_spider_output(self, response: Response, result: AsyncIterator[Any]) -> AsyncIterator[Any]:
        handout = handout_of(response.request)
        if handout is None or not handout.awaiting_output:
            async for out in result:
                yield out
            return
        try:
            async for out in result:
                if isinstance(out, Request) and handout.awaiting_output:
                    handout.completer.capture(handout, out)
                else:  # items; and requests after the lease was completed (HOSTRING_OUTPUT_TIMEOUT_S): Discovered
                    yield out
        finally:
            handout.completer.finish_output(handout)

    def process_spider_exception(self, response: Response, exception: Exception) -> None:
        handout = handout_of(response.request)
        if handout is not None and handout.awaiting_output:
            handout.completer.finish_output(handout)
