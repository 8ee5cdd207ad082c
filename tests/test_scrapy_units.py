"""hostring.scrapy's parts without a crawl: the request codec (against Scrapy's own serialisation as the oracle),
outcomes and error classes, settings, the static ring, and that `import hostring` never needs Scrapy.

The crawls themselves (real `scrapy runspider` processes against a loopback web) are in test_scrapy_e2e.py.
"""

from __future__ import annotations

import datetime
import email.utils
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import FormRequest, Request, Spider
from scrapy.exceptions import CannotResolveHostError, DownloadTimeoutError, IgnoreRequest, NotConfigured
from scrapy.http import HtmlResponse, JsonRequest
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler
from twisted.internet import error as twisted_error

from hostring.fingerprint import body_digest, simhash64
from hostring.limits import MAX_LINK_PAYLOAD_BYTES
from hostring.retry_after import parse_retry_after
from hostring.ring import Member, Ring
from hostring.scrapy import (
    Addon,
    BadPayload,
    DownloaderMiddleware,
    HostringConfigError,
    PluginConfig,
    RequestNotSerializable,
    SpiderMiddleware,
)
from hostring.scrapy.codec import TRANSIENT_META, decode, encode
from hostring.scrapy.config import check_crawler_settings
from hostring.scrapy.outcome import ROBOTS_MAX_BYTES, error_class, error_outcome, response_outcome
from hostring.scrapy.session import StaticRing

REPO = Path(__file__).resolve().parent.parent


class ExampleSpider(Spider):
    name = "example"

    def parse(self, response: Any, **kwargs: Any) -> None: ...

    def parse_item(self, response: Any, **kwargs: Any) -> None: ...

    def on_error(self, failure: Any) -> None: ...

    alias = parse_item  # the same method under a second name


SPIDER = ExampleSpider()

# ---------------------------------------------------------------------------------------------- codec

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_token = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=10)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False)
    | _text
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def requests(draw: st.DrawFn) -> Request:
    """Requests of the three common classes with any mix of the attributes Scrapy serialises."""
    cls = draw(st.sampled_from([Request, FormRequest, JsonRequest]))
    kwargs: dict[str, Any] = {
        "callback": draw(st.sampled_from([None, SPIDER.parse, SPIDER.parse_item])),
        "errback": draw(st.sampled_from([None, SPIDER.on_error])),
        "method": draw(st.sampled_from(["GET", "POST", "PUT"])),
        "headers": draw(st.dictionaries(_token, st.text("abc XYZ;=/0123é", max_size=10), max_size=3)),
        "body": draw(st.binary(max_size=40)),
        "cookies": draw(st.dictionaries(_token, _token, max_size=2)),
        "meta": draw(st.dictionaries(_text.filter(lambda k: k not in TRANSIENT_META), _json, max_size=3)),
        "encoding": draw(st.sampled_from(["utf-8", "latin-1"])),
        "priority": draw(st.integers(-1000, 1000)),
        "dont_filter": draw(st.booleans()),
        "flags": draw(st.lists(_token, max_size=2)),
        "cb_kwargs": draw(st.dictionaries(_token, _json, max_size=2)),
    }
    return cls(f"http://a.example/{draw(_token)}", **kwargs)


def as_scrapy_stores_it(request: Request) -> dict[str, Any]:
    """Scrapy's disk-queue form of a request (the oracle), less what hostring deliberately leaves out."""
    d = request.to_dict(spider=SPIDER)
    d.pop("url")
    d["meta"] = {k: v for k, v in d["meta"].items() if k not in TRANSIENT_META}
    return d


@settings(max_examples=150, deadline=None)
@given(requests())
def test_a_request_comes_back_as_scrapy_would_store_it(request: Request) -> None:
    """decode(encode(r)) is, attribute for attribute, the request Scrapy's own disk queues would give back."""
    back = decode(encode(request, SPIDER), request.url, SPIDER)
    assert type(back) is type(request)
    assert back.url == request.url
    assert as_scrapy_stores_it(back) == as_scrapy_stores_it(request)


def test_a_plain_request_travels_as_no_bytes_and_the_url_is_the_lease_s() -> None:
    assert encode(Request("http://a.example/x"), SPIDER) == b""
    assert encode(Request("http://a.example/x", callback=SPIDER.parse_item), SPIDER) != b""
    back = decode(encode(Request("http://a.example/x", meta={"depth": 3, "k": 1}), SPIDER), "http://b.example/", SPIDER)
    assert back.url == "http://b.example/" and back.meta == {"k": 1}  # depth comes from the lease, not the payload


def test_tuples_arrive_as_lists_and_a_method_alias_is_found() -> None:
    r = Request("http://a.example/", meta={"t": (1, b"\x00")}, callback=SPIDER.alias)
    back = decode(encode(r, SPIDER), r.url, SPIDER)
    assert back.meta == {"t": [1, b"\x00"]}
    assert back.callback == SPIDER.parse_item


class Opaque:
    pass


@pytest.mark.parametrize(
    ("request_", "named"),
    [
        (Request("http://a.example/", meta={"item": {"deep": [Opaque()]}}), r"meta\['item'\]\['deep'\]\[0\] is a "),
        (Request("http://a.example/", cb_kwargs={"when": datetime.date(2024, 1, 1)}), r"cb_kwargs\['when'\]"),
        (Request("http://a.example/", meta={1: "x"}), "has a key 1 that is not a str"),
        (Request("http://a.example/", meta={"b": {"$bytes": "x"}}), "reserved key"),
        (Request("http://a.example/", callback=lambda r: None), "is not a method of spider 'example'"),
        (Request("http://a.example/", callback=print), "is not a method of spider 'example'"),
        (Request("http://a.example/", body=b"x" * MAX_LINK_PAYLOAD_BYTES, method="POST"), "bytes, over hostring's"),
    ],
)
def test_a_request_that_cannot_travel_gets_a_named_error(request_: Request, named: str) -> None:
    with pytest.raises(RequestNotSerializable, match=named) as info:
        encode(request_, SPIDER)
    assert "<GET http://a.example/>" in str(info.value) or "<POST http://a.example/>" in str(info.value)


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        (b"{not json", "not JSON"),
        (b'{"v": 99}', "not a version-1"),
        (b"[1, 2]", "not a version-1"),
        (b'{"v": 1, "callback": "no_such_method"}', "has no method 'no_such_method'"),
        (b'{"v": 1, "_class": "os.path.join"}', "is not a scrapy.Request class"),
        (b'{"v": 1, "_class": "no.such.module.Request"}', "cannot be imported here"),
        (b'{"v": 1, "body": {"$bytes": "%%%"}}', "does not make a Request"),
        (b'{"v": 1, "priority": "high"}', "does not make a Request"),
    ],
)
def test_a_payload_this_spider_cannot_rebuild_is_a_bad_payload(payload: bytes, named: str) -> None:
    with pytest.raises(BadPayload, match=named):
        decode(payload, "http://a.example/", SPIDER)


# ---------------------------------------------------------------------------------------------- outcomes


def test_retry_after_reads_seconds_and_dates() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after(None) == -1.0 and parse_retry_after(b"") == -1.0 and parse_retry_after(b"soon") == -1.0
    assert parse_retry_after(b" 120 ") == 120.0
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True).encode(), now=now) == pytest.approx(30.0)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True).encode(), now=now) == 0.0


@pytest.mark.parametrize(
    ("exc", "name"),
    [
        (DownloadTimeoutError("t"), "timeout"),
        (twisted_error.TimeoutError(), "timeout"),
        (CannotResolveHostError("x"), "dns_error"),
        (twisted_error.DNSLookupError(), "dns_error"),
        (twisted_error.ConnectionRefusedError(), "connect_error"),
        (twisted_error.ConnectionLost(), "protocol_error"),
        (IgnoreRequest("offsite"), "ignored"),
        (ValueError("a bug in a middleware"), "client_error"),
    ],
)
def test_download_errors_get_the_node_s_names(exc: Exception, name: str) -> None:
    assert error_class(exc) == name
    outcome = error_outcome(exc, 1.5)
    assert (outcome.error_class, outcome.status, outcome.response_s) == (name, 0, 1.5)
    assert outcome.error_detail.startswith(type(exc).__name__)


def test_response_outcomes() -> None:
    body = b"<html><title>t</title><body>hello there world</body></html>"
    ok = HtmlResponse("http://a.example/", status=200, body=body, headers={"ETag": '"e"', "Content-Type": "text/html"})
    o = response_outcome(ok, 0.25, robots=False, simhash=True)
    assert (o.status, o.bytes, o.response_s, o.etag, o.content_type) == (200, len(body), 0.25, '"e"', "text/html")
    assert o.body_digest == body_digest(body) and o.simhash == simhash64("t hello there world")  # the visible text
    assert response_outcome(ok, 0.25, robots=False, simhash=False).simhash == 0

    moved = HtmlResponse("http://a.example/", status=301, headers={"Location": "/ünï code?x=1"})
    o = response_outcome(moved, 0.1, robots=False, simhash=True)
    assert o.location == "/%C3%BCn%C3%AF%20code?x=1" and not o.body_digest

    busy = HtmlResponse("http://a.example/", status=429, headers={"Retry-After": "7"}, body=b"slow down")
    assert response_outcome(busy, 0.1, robots=False, simhash=True).retry_after_s == 7.0

    robots = HtmlResponse("http://a.example/robots.txt", status=200, body=b"#" * (ROBOTS_MAX_BYTES + 10))
    o = response_outcome(robots, 0.1, robots=True, simhash=True)
    assert len(o.robots_body) == ROBOTS_MAX_BYTES and not o.body_digest


# ---------------------------------------------------------------------------------------------- settings


def crawler_settings(**values: Any) -> Settings:
    s = Settings()
    Addon().update_settings(s)
    s.setdict(values, priority="cmdline")
    return s


def test_settings_need_exactly_one_of_nodes_and_coordinator() -> None:
    with pytest.raises(HostringConfigError, match="exactly one of HOSTRING_NODES"):
        PluginConfig.from_settings(crawler_settings())
    with pytest.raises(HostringConfigError, match="both are set"):
        PluginConfig.from_settings(crawler_settings(HOSTRING_NODES="a:1", HOSTRING_COORDINATOR="c:2"))
    cfg = PluginConfig.from_settings(crawler_settings(HOSTRING_NODES=" a:1, b:2 ,", CONCURRENT_REQUESTS=7), "s")
    assert cfg.nodes == ("a:1", "b:2") and cfg.max_leased == 7 and cfg.worker_id.startswith("scrapy-s-")
    assert PluginConfig.from_settings(crawler_settings(HOSTRING_NODES=["a:1"])).nodes == ("a:1",)
    assert PluginConfig.from_settings(crawler_settings(HOSTRING_COORDINATOR="c:2")).coordinator == "c:2"


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"HOSTRING_WHEN_DRAINED": "sometimes"}, "HOSTRING_WHEN_DRAINED"),
        ({"HOSTRING_MAX_LEASED": 0}, "HOSTRING_MAX_LEASED"),
        ({"HOSTRING_DRAIN_GRACE_S": -1}, "HOSTRING_DRAIN_GRACE_S"),
        ({"HOSTRING_LEASE_WAIT_S": 0}, "HOSTRING_LEASE_WAIT_S must be above 0"),
        ({"HOSTRING_LEASE_WAIT_S": 31}, "at most 30 .a node's cap"),
        ({"HOSTRING_TLS_KEY": __file__}, "HOSTRING_TLS_.*go together"),
        ({"HOSTRING_TLS_CA": "/no/such/ca.pem"}, "cannot read TLS CA"),
    ],
)
def test_bad_settings_are_named(values: dict[str, Any], named: str) -> None:
    with pytest.raises(HostringConfigError, match=named):
        PluginConfig.from_settings(crawler_settings(HOSTRING_NODES="a:1", **values))


def test_the_scheduler_alone_is_all_it_takes(caplog: pytest.LogCaptureFixture) -> None:
    """SCHEDULER alone passes the settings check without a word (the former refusal is gone); the add-on sets just
    that; the two middlewares an earlier version needed still load and disable themselves, saying why."""
    with caplog.at_level(logging.WARNING, "hostring.scrapy"):
        check_crawler_settings(Settings({"SCHEDULER": "hostring.scrapy.Scheduler"}))
    assert caplog.text == ""
    addon = crawler_settings()
    assert addon["SCHEDULER"] == "hostring.scrapy.Scheduler"
    assert not any("hostring" in str(k) for k in addon.getdict("DOWNLOADER_MIDDLEWARES"))
    assert not any("hostring" in str(k) for k in addon.getdict("SPIDER_MIDDLEWARES"))
    crawler = get_crawler(ExampleSpider)
    for middleware, setting in (
        (DownloaderMiddleware, "DOWNLOADER_MIDDLEWARES"),
        (SpiderMiddleware, "SPIDER_MIDDLEWARES"),
    ):
        with pytest.raises(NotConfigured, match=f"not needed any more: .*remove it from {setting}"):
            middleware.from_crawler(crawler)


def test_settings_hostring_makes_irrelevant_are_named(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "hostring.scrapy"):
        check_crawler_settings(crawler_settings(ROBOTSTXT_OBEY=True, AUTOTHROTTLE_ENABLED=True, DOWNLOAD_DELAY=1))
    text = caplog.text
    assert "hostring owns robots.txt" in text and "AutoThrottle" in text and "DOWNLOAD_DELAY" in text


# ---------------------------------------------------------------------------------------------- routing


def test_a_static_ring_routes_every_domain_alike_in_every_process() -> None:
    one = StaticRing(["n1:1"])
    assert {one.owner(f"d{i}.example") for i in range(50)} == {"n1:1"}
    addresses = ["n1:1", "n2:2", "n3:3"]
    a, b = StaticRing(addresses), StaticRing(list(reversed(addresses)))
    ring = Ring(1, [Member(x, x) for x in addresses])
    owners = {d: a.owner(d) for d in (f"d{i}.example" for i in range(300))}
    assert owners == {d: b.owner(d) for d in owners} == {d: ring.owner(d).address for d in owners}  # type: ignore[union-attr]
    assert set(owners.values()) == set(addresses)
    with pytest.raises(ValueError, match="at least one"):
        StaticRing([])


# ---------------------------------------------------------------------------------------------- imports


def test_hostring_imports_without_scrapy_and_the_plugin_says_what_to_install() -> None:
    code = """
import importlib.abc, sys
class NoScrapy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "scrapy" or name.startswith("scrapy."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NoScrapy())
import hostring, hostring.client, hostring.membership, hostring.urls, hostring.fingerprint
assert not any(m == "scrapy" or m.startswith("scrapy.") for m in sys.modules)
try:
    import hostring.scrapy
except ImportError as e:
    print(e)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "hostring.scrapy needs Scrapy: pip install 'hostring[scrapy]'" in out.stdout
