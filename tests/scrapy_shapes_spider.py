"""A spider of the shapes Scrapy allows, run by tests/test_scrapy_e2e.py through hostring with only
`SCHEDULER = "hostring.scrapy.Scheduler"`:

- a CrawlSpider: its start URL has no callback, so Scrapy's default dispatch applies the rules (and
  parse_start_url), here after a redirect hostring followed;
- an async-generator callback that awaits between its outputs, and a coroutine callback returning a list;
- a request without an errback answered 404 (Scrapy's HttpErrorMiddleware ignores it), one that times out
  (Scrapy logs the download error), and a status the request asks to handle itself (handle_httpstatus_list);
- a downloader middleware that replaces one download with a request for another URL.

Each item says whether the callback saw its own method as response.request.callback.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from scrapy import Request
from scrapy.http import Response
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule


class Replace:
    """A downloader middleware that answers the request for /replaced with a request for /landing."""

    def process_request(self, request: Request) -> Request | None:
        if request.url.endswith("/replaced"):
            return request.replace(url=request.url.replace("/replaced", "/landing"))
        return None


class ShapesSpider(CrawlSpider):
    name = "shapes"
    custom_settings = {"SCHEDULER": "hostring.scrapy.Scheduler", "DOWNLOADER_MIDDLEWARES": {Replace: 543}}
    rules = (Rule(LinkExtractor(allow=r"/rule/"), callback="parse_rule", follow=True),)

    def __init__(self, site: str = "", slow: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.site, self.slow = site, slow
        self.start_urls = [f"{site}/start"]

    async def start(self) -> AsyncIterator[Any]:
        async for request in super().start():
            yield request
        yield Request(f"{self.site}/async", callback=self.parse_async, cb_kwargs={"n": 1})
        yield Request(f"{self.site}/missing", callback=self.parse_status)
        yield Request(f"{self.site}/gone", callback=self.parse_status, meta={"handle_httpstatus_list": [410]})
        yield Request(f"{self.slow}/", callback=self.parse_status)
        yield Request(f"{self.site}/replaced", callback=self.parse_status)

    def _own(self, response: Response) -> bool:
        return getattr(response.request.callback, "__self__", None) is self  # type: ignore[union-attr]

    def parse_start_url(self, response: Response, **kwargs: Any) -> list[dict[str, Any]]:
        return [{"kind": "start", "url": response.url}]

    def parse_rule(self, response: Response) -> Iterator[dict[str, Any]]:
        yield {"kind": "rule", "url": response.url, "own": self._own(response)}

    async def parse_async(self, response: Response, n: int) -> AsyncIterator[Any]:
        yield {"kind": "async", "url": response.url, "n": n, "own": self._own(response)}
        await asyncio.sleep(0.05)
        yield response.follow("/coro", callback=self.parse_coro, cb_kwargs={"n": n + 1})

    async def parse_coro(self, response: Response, n: int) -> list[dict[str, Any]]:
        await asyncio.sleep(0.05)
        return [{"kind": "coro", "url": response.url, "n": n, "own": self._own(response)}]

    def parse_status(self, response: Response) -> Iterator[dict[str, Any]]:
        yield {"kind": "status", "url": response.url, "status": response.status, "own": self._own(response)}
