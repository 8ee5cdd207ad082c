"""A Scrapy spider that crawls politely through hostring, from one process or many.

Start a frontier node (or a cluster) and as many copies of this spider as you like, on as many machines:
every URL is fetched once between them, never more than one request at a time per host, robots.txt obeyed
(RFC 9309), retries and redirects scheduled by hostring.

    hostring node --store sqlite:///frontier.sqlite3 --listen 127.0.0.1:50051 --delay 1 \
        --user-agent "example-bot/1.0 (+https://example.org/bot)"
    scrapy runspider examples/scrapy_spider.py -a start=https://example.org/ \
        -s HOSTRING_NODES=127.0.0.1:50051 -s USER_AGENT="example-bot/1.0 (+https://example.org/bot)" \
        -O pages.jsonl

The only hostring-specific line is `SCHEDULER` in `custom_settings`, plus where the nodes are
(HOSTRING_NODES or HOSTRING_COORDINATOR: here on the command line; they may as well sit next to SCHEDULER, or
in settings.py). The rest is an ordinary spider: it follows links (not the rel=nofollow ones, and none from a
page whose meta robots says nofollow), passes cb_kwargs and meta along
(they travel through hostring with the request), and reports downloads that failed for good in an errback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import scrapy
from scrapy.http import Response, TextResponse
from scrapy.linkextractors import LinkExtractor
from twisted.python.failure import Failure


class PagesSpider(scrapy.Spider):
    name = "pages"
    custom_settings = {"SCHEDULER": "hostring.scrapy.Scheduler"}

    def __init__(self, start: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [url for url in start.split(",") if url]
        self.links = LinkExtractor()

    def parse(self, response: Response, parent: str = "") -> Iterator[Any]:
        if not isinstance(response, TextResponse):
            return
        yield {
            "url": response.url,
            "status": response.status,
            "title": response.css("title::text").get(),
            "depth": response.meta.get("depth", 0),
            "parent": parent,
            "via": response.meta.get("via", "start"),
        }
        robots = " ".join(response.css('meta[name="robots" i]::attr(content)').getall()).lower()
        if "nofollow" in robots or "none" in robots:
            return
        for link in self.links.extract_links(response):
            if not link.nofollow:
                yield response.follow(
                    link.url,
                    callback=self.parse,
                    errback=self.failed,
                    cb_kwargs={"parent": response.url},
                    meta={"via": "link"},
                )

    def failed(self, failure: Failure) -> Iterator[Any]:
        request = failure.request  # type: ignore[attr-defined]
        error = failure.type.__name__ if failure.type else "?"
        yield {"url": request.url, "error": error, "via": request.meta.get("via"), "status": _status(failure)}


def _status(failure: Failure) -> int:
    """The HTTP status of an HttpError failure (a response the spider's HttpErrorMiddleware filtered), else 0."""
    response = getattr(failure.value, "response", None)
    return int(response.status) if response is not None else 0
