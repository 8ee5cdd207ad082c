"""The plug-in's settings, read once from Scrapy's settings, with a named error for anything that cannot work."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Literal

from scrapy.settings import BaseSettings

from hostring.limits import MAX_WAIT_MS
from hostring.security import INSECURE, SecurityConfigError, TlsConfig

log = logging.getLogger("hostring.scrapy")


class HostringConfigError(ValueError):
    """Settings the plug-in cannot run with; the message says which setting and what to do."""


@dataclass(frozen=True)
class PluginConfig:
    """What the scheduler needs to know, from HOSTRING_* settings (and CONCURRENT_REQUESTS)."""

    nodes: tuple[str, ...] = ()
    """HOSTRING_NODES: node addresses. One node owns everything; several are sharded by a fixed ring of them."""
    coordinator: str = ""
    """HOSTRING_COORDINATOR: a cluster's coordinator; nodes and domain owners come from its ring."""
    tls: TlsConfig = INSECURE
    """HOSTRING_TLS_CERT, HOSTRING_TLS_KEY, HOSTRING_TLS_CA: PEM files, as the worker's --tls-* flags."""
    worker_id: str = ""
    """HOSTRING_WORKER_ID: how this process introduces itself in leases (default scrapy-<spider>-<host>-<pid>)."""
    max_leased: int = 16
    """HOSTRING_MAX_LEASED: leases held at once (default CONCURRENT_REQUESTS)."""
    when_drained: Literal["close", "wait"] = "close"
    """HOSTRING_WHEN_DRAINED: close the spider when hostring has nothing queued or in flight, or wait for more."""
    drain_grace_s: float = 2.0
    """HOSTRING_DRAIN_GRACE_S: how long every node must stay drained before "close" ends the spider."""
    lease_wait_s: float = 1.0
    """HOSTRING_LEASE_WAIT_S: how long a Lease, or a completion asking for leases, waits on the node for an item to
    become ready (above 0, at most 30 s: the node's cap)."""
    simhash: bool = True
    """HOSTRING_SIMHASH: report the simhash of 2xx text bodies (near-duplicate detection) with each completion."""
    connect_timeout_s: float = 30.0
    """HOSTRING_CONNECT_TIMEOUT_S: how long to wait for the coordinator's ring at start."""
    output_timeout_s: float = 300.0
    """HOSTRING_OUTPUT_TIMEOUT_S: how long a 2xx page's lease waits for the spider's output before it is
    completed without the links (a callback that never ends must not hold its host for ever)."""

    @classmethod
    def from_settings(cls, settings: BaseSettings, spider_name: str = "spider") -> PluginConfig:
        nodes_setting = settings.get("HOSTRING_NODES") or ""
        if isinstance(nodes_setting, str):
            nodes = tuple(n.strip() for n in nodes_setting.split(",") if n.strip())
        else:
            nodes = tuple(str(n).strip() for n in nodes_setting if str(n).strip())
        coordinator = str(settings.get("HOSTRING_COORDINATOR") or "").strip()
        if bool(nodes) == bool(coordinator):
            raise HostringConfigError(
                "hostring.scrapy needs exactly one of HOSTRING_NODES (comma-separated frontier node addresses, "
                "e.g. '127.0.0.1:50051') and HOSTRING_COORDINATOR (a cluster coordinator's address)"
                + (f"; both are set ({nodes_setting!r}, {coordinator!r})" if nodes else "")
            )
        try:
            tls = TlsConfig.from_files(
                settings.get("HOSTRING_TLS_CERT"), settings.get("HOSTRING_TLS_KEY"), settings.get("HOSTRING_TLS_CA")
            )
        except SecurityConfigError as e:
            raise HostringConfigError(f"HOSTRING_TLS_*: {e}") from e
        when = str(settings.get("HOSTRING_WHEN_DRAINED") or "close")
        if when not in ("close", "wait"):
            raise HostringConfigError(f"HOSTRING_WHEN_DRAINED must be 'close' or 'wait', not {when!r}")
        max_leased = settings.getint("HOSTRING_MAX_LEASED", settings.getint("CONCURRENT_REQUESTS", 16))
        if max_leased < 1:
            raise HostringConfigError(f"HOSTRING_MAX_LEASED must be >= 1, not {max_leased}")
        numbers = {
            name: settings.getfloat(name, default)
            for name, default in (
                ("HOSTRING_DRAIN_GRACE_S", 2.0),
                ("HOSTRING_LEASE_WAIT_S", 1.0),
                ("HOSTRING_CONNECT_TIMEOUT_S", 30.0),
                ("HOSTRING_OUTPUT_TIMEOUT_S", 300.0),
            )
        }
        for name, value in numbers.items():
            if not value >= 0:
                raise HostringConfigError(f"{name} must be >= 0, not {value}")
        wait = numbers["HOSTRING_LEASE_WAIT_S"]
        if not 0 < wait <= MAX_WAIT_MS / 1000:  # 0 would poll without pause; a node refuses a longer wait
            raise HostringConfigError(
                f"HOSTRING_LEASE_WAIT_S must be above 0 and at most {MAX_WAIT_MS / 1000:g} (a node's cap), not {wait}"
            )
        worker_id = str(settings.get("HOSTRING_WORKER_ID") or "")
        return cls(
            nodes=nodes,
            coordinator=coordinator,
            tls=tls,
            worker_id=worker_id or f"scrapy-{spider_name}-{socket.gethostname()}-{os.getpid()}",
            max_leased=max_leased,
            when_drained="wait" if when == "wait" else "close",
            drain_grace_s=numbers["HOSTRING_DRAIN_GRACE_S"],
            lease_wait_s=numbers["HOSTRING_LEASE_WAIT_S"],
            simhash=settings.getbool("HOSTRING_SIMHASH", True),
            connect_timeout_s=numbers["HOSTRING_CONNECT_TIMEOUT_S"],
            output_timeout_s=numbers["HOSTRING_OUTPUT_TIMEOUT_S"],
        )


def check_crawler_settings(settings: BaseSettings) -> None:
    """Warn about settings hostring makes irrelevant (nothing else is needed besides SCHEDULER)."""
    if settings.getbool("ROBOTSTXT_OBEY"):
        log.warning(
            "ROBOTSTXT_OBEY is on, but hostring owns robots.txt (RFC 9309, fetched once per origin through this "
            "downloader): requests hostring hands out skip Scrapy's RobotsTxtMiddleware, so nothing is fetched twice"
        )
    if settings.getbool("AUTOTHROTTLE_ENABLED"):
        log.warning(
            "AUTOTHROTTLE_ENABLED has no say under hostring: the nodes pace every host (delay, Crawl-delay, backoff "
            "on 429/5xx and slow answers) across all processes; AutoThrottle could only add delay on top"
        )
    if settings.getfloat("DOWNLOAD_DELAY") > 0:
        log.warning(
            "DOWNLOAD_DELAY is added on top of hostring's per-host delay (set it on the nodes: --delay); "
            "consider DOWNLOAD_DELAY = 0"
        )
