"""`ADDONS = {"hostring.scrapy.Addon": 0}`: one setting that installs the scheduler and its two middlewares."""

from __future__ import annotations

from scrapy.settings import BaseSettings

from hostring.scrapy.config import MIDDLEWARE_ORDER, SPIDER_MIDDLEWARE_ORDER
from hostring.scrapy.middleware import DownloaderMiddleware, SpiderMiddleware


class Addon:
    """Sets SCHEDULER = "hostring.scrapy.Scheduler" and enables the plug-in's downloader and spider middlewares."""

    def update_settings(self, settings: BaseSettings) -> None:
        settings.set("SCHEDULER", "hostring.scrapy.Scheduler", "addon")
        settings.set_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", DownloaderMiddleware, MIDDLEWARE_ORDER)
        settings.set_in_component_priority_dict("SPIDER_MIDDLEWARES", SpiderMiddleware, SPIDER_MIDDLEWARE_ORDER)
