"""Scrapy through hostring: a scheduler plug-in that makes a spider's requests hostring frontier items.

    SCHEDULER = "hostring.scrapy.Scheduler"
    HOSTRING_NODES = "127.0.0.1:50051"         # or HOSTRING_COORDINATOR = "coordinator:50050"

Every request the spider yields is Discovered; requests come back only from Leases, so robots.txt (fetched
through Scrapy's own downloader when a node leases it), politeness, backoff, retries, redirects, dedup and trap
budgets are hostring's, across any number of Scrapy processes. Nothing else needs enabling: the scheduler gives
each request it hands out its own callback and errback, which complete the lease and then call the spider's.
`ADDONS = {"hostring.scrapy.Addon": 0}` sets the same SCHEDULER; the two middlewares an earlier version needed
(DownloaderMiddleware, SpiderMiddleware) still load, and disable themselves. The README's "Scrapy" section has
the details.

Needs the `scrapy` extra (`pip install 'hostring[scrapy]'`); importing `hostring` itself never needs Scrapy.
"""

from __future__ import annotations

try:
    import scrapy  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised in a subprocess by tests/test_scrapy_units.py
    raise ImportError("hostring.scrapy needs Scrapy: pip install 'hostring[scrapy]'") from e

from hostring.scrapy.addon import Addon
from hostring.scrapy.codec import BadPayload, RequestNotSerializable
from hostring.scrapy.config import HostringConfigError, PluginConfig
from hostring.scrapy.middleware import DownloaderMiddleware, SpiderMiddleware
from hostring.scrapy.scheduler import Scheduler

__all__ = [
    "Addon",
    "BadPayload",
    "DownloaderMiddleware",
    "HostringConfigError",
    "PluginConfig",
    "RequestNotSerializable",
    "Scheduler",
    "SpiderMiddleware",
]
