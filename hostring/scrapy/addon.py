"""`ADDONS = {"hostring.scrapy.Addon": 0}`: the same as `SCHEDULER = "hostring.scrapy.Scheduler"`, for projects
that enable their plug-ins as add-ons."""

from __future__ import annotations

from scrapy.settings import BaseSettings


class Addon:
    """Sets SCHEDULER = "hostring.scrapy.Scheduler" (the one setting the plug-in needs, besides where the nodes are)."""

    def update_settings(self, settings: BaseSettings) -> None:
        settings.set("SCHEDULER", "hostring.scrapy.Scheduler", "addon")
