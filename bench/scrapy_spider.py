"""The spider bench/scrapy.py runs: the README example's crawl logic, with or without hostring.

`scrapy runspider bench/scrapy_spider.py -a start=URL,URL`; with HOSTRING_BENCH_PLUGIN=1 in the environment
it sets SCHEDULER = "hostring.scrapy.Scheduler" (the one setting hostring needs), otherwise it runs on Scrapy's
own scheduler.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import scrapy
from scrapy.http import Response, TextResponse
from scrapy.linkextractors import LinkExtractor
from scrapy.settings import BaseSettings


class BenchSpider(scrapy.Spider):
    name = "bench"

    @classmethod
    def update_settings(cls, settings: BaseSettings) -> None:
        super().update_settings(settings)
        if os.environ.get("HOSTRING_BENCH_PLUGIN") == "1":
            settings.set("SCHEDULER", "hostring.scrapy.Scheduler", "spider")

    def __init__(self, start: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [url for url in start.split(",") if url]
        self.links = LinkExtractor()

    def parse(self, response: Response, parent: str = "") -> Iterator[Any]:
        if not isinstance(response, TextResponse):
            return
        yield {"url": response.url, "title": response.css("title::text").get(), "parent": parent}
        for link in self.links.extract_links(response):
            if not link.nofollow:
                yield response.follow(link.url, callback=self.parse, cb_kwargs={"parent": response.url})
