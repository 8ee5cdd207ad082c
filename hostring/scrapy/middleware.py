"""The plug-in's two former middlewares, kept so that settings naming them still load.

`SCHEDULER = "hostring.scrapy.Scheduler"` now does their work by itself (completion.py: the scheduler gives each
request it hands out its own callback and errback). Enabled anyway (by an older settings.py), each disables
itself with one line in Scrapy's log, and the crawl runs as without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from scrapy.exceptions import NotConfigured

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

_UNNEEDED = (
    "not needed any more: SCHEDULER = 'hostring.scrapy.Scheduler' completes hostring's leases by itself; "
    "remove it from {setting}"
)


class DownloaderMiddleware:
    """Formerly completed leases from their downloads; now disables itself (see the module docstring)."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> NoReturn:
        raise NotConfigured(_UNNEEDED.format(setting="DOWNLOADER_MIDDLEWARES"))


class SpiderMiddleware:
    """Formerly captured the requests a page's callback yields; now disables itself (see the module docstring)."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> NoReturn:
        raise NotConfigured(_UNNEEDED.format(setting="SPIDER_MIDDLEWARES"))
