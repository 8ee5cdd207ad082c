"""The safe fetch, against real HTTP servers started on 127.0.0.1 by these tests.

Every server binds to a loopback address and port 0, handles a bounded number
of requests with socket timeouts, and is shut down at the end of its test.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import gzip
import shutil
import socket
import ssl
import subprocess
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import brotli
import pytest

from fetch_worker.fetch import Fetcher, FetchLimits, FetchResult, location_text
from fetch_worker.netpolicy import NetworkPolicy, ResolutionFailed
from hostring.retry_after import parse_retry_after

UA = "hostring-test/0.1 (+https://hostring.invalid/bot)"
LOOPBACK = NetworkPolicy(allow=["127.0.0.0/8"])
FAST = FetchLimits(connect_timeout_s=2.0, read_timeout_s=2.0, total_timeout_s=5.0)
HTML = b'<!doctype html><html><head><title>t</title></head><body><a href="/next">next</a></body></html>'

Route = Callable[["Handler"], None]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 5  # a stuck client cannot pin a server thread
    disable_nagle_algorithm = True  # else headers and body in two writes meet delayed ACK: +40 ms a request
    server: TestServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        self.server.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        route = self.server.routes.get(path)
        try:
            if route is None:
                self.reply(404, b"<p>not found</p>")
            else:
                route(self)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, TimeoutError):
            self.close_connection = True

    def reply(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "text/html; charset=utf-8",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class TestServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that counts accepted connections and records requests."""

    daemon_threads = True
    __test__ = False

    def __init__(self, host: str, routes: dict[str, Route], tls: ssl.SSLContext | None = None) -> None:
        self.routes = routes
        self.accepted = 0
        self.seen: list[tuple[str, dict[str, str]]] = []
        self._tls = tls
        self.host = host
        super().__init__((host, 0), Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = self.socket.accept()
        self.accepted += 1
        conn.settimeout(5)
        if self._tls is not None:
            conn = self._tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, addr

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self, path: str, host: str = "") -> str:
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{host or self.host}:{self.port}{path}"


@pytest.fixture
def serve() -> Iterator[Callable[..., TestServer]]:
    servers: list[TestServer] = []

    def start(routes: dict[str, Route], host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> TestServer:
        server = TestServer(host, routes, tls)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def fetch(
    url: str,
    policy: NetworkPolicy = LOOPBACK,
    limits: FetchLimits = FAST,
    robots: bool = False,
    **kwargs: Any,
) -> FetchResult:
    async def go() -> FetchResult:
        async with Fetcher(policy, UA, limits, **kwargs.pop("fetcher_kwargs", {})) as fetcher:
            if robots:
                return await fetcher.fetch_robots(url)
            return await fetcher.fetch(url, **kwargs)

    return asyncio.run(go())


# --- the network policy at connect time -------------------------------------------------------


def test_loopback_without_allowlist_is_refused_before_connecting(serve: Callable[..., TestServer]) -> None:
    server = serve({"/": lambda h: h.reply(200, HTML)})
    result = fetch(server.url("/"), policy=NetworkPolicy())
    assert result.error_class == "network_policy"
    assert result.status == 0
    assert "loopback" in result.error_detail
    assert result.remote_ip == "127.0.0.1"
    assert server.accepted == 0


def test_hostname_resolving_to_loopback_is_refused(serve: Callable[..., TestServer]) -> None:
    server = serve({"/": lambda h: h.reply(200, HTML)})
    result = fetch(server.url("/", host="localhost"), policy=NetworkPolicy())
    assert result.error_class == "network_policy"
    assert server.accepted == 0


def test_allowlisted_hostname_connects_to_the_checked_address(serve: Callable[..., TestServer]) -> None:
    server = serve({"/": lambda h: h.reply(200, HTML)})
    result = fetch(server.url("/", host="localhost"))
    assert result.status == 200
    assert result.remote_ip == "127.0.0.1"
    assert server.seen[0][1]["host"] == f"localhost:{server.port}"


def fake_dns(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[list[str]]]) -> list[str]:
    """Answer getaddrinfo for the given test names from a script of loopback-only answers.

    Each lookup of a name pops its next answer; the log lists the names asked for.
    IP literals (which anyio passes to getaddrinfo too) go to the real resolver.
    """
    asked: list[str] = []
    real = asyncio.base_events.BaseEventLoop.getaddrinfo

    async def getaddrinfo(self: asyncio.AbstractEventLoop, host: Any, port: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name not in answers:
            return await real(self, host, port, **kwargs)  # type: ignore[arg-type]
        asked.append(name)
        script = answers[name]
        ips = script.pop(0) if len(script) > 1 else script[0]
        assert all(ip.startswith("127.") for ip in ips), "tests never aim anywhere but loopback"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, int(port))) for ip in ips]

    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "getaddrinfo", getaddrinfo)
    return asked


def test_dns_rebinding_cannot_swap_the_address_after_the_check(
    serve: Callable[..., TestServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    good = serve({"/": lambda h: h.reply(200, HTML)})
    other = serve({"/": lambda h: h.reply(200, b"internal")}, host="127.0.0.2")
    asked = fake_dns(monkeypatch, {"rebind.test": [["127.0.0.1"], ["127.0.0.2"]]})
    policy = NetworkPolicy(allow=["127.0.0.1/32"])

    first = fetch(good.url("/", host="rebind.test"), policy=policy)
    assert (first.status, first.remote_ip) == (200, "127.0.0.1")
    assert asked == ["rebind.test"]  # resolved once; the socket was opened to the checked literal
    assert good.seen[0][1]["host"] == f"rebind.test:{good.port}"

    second = fetch(f"http://rebind.test:{other.port}/", policy=policy)
    assert (second.error_class, second.remote_ip) == ("network_policy", "127.0.0.2")
    assert other.accepted == 0


def test_next_address_is_tried_when_the_first_refuses(
    serve: Callable[..., TestServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = serve({"/": lambda h: h.reply(200, HTML)})
    fake_dns(monkeypatch, {"multi.test": [["127.0.0.2", "127.0.0.1"]]})
    result = fetch(server.url("/", host="multi.test"))
    assert (result.status, result.remote_ip) == (200, "127.0.0.1")


def test_slow_resolver_counts_against_the_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    async def slow(self: NetworkPolicy, host: str, port: int) -> list[str]:
        await asyncio.sleep(5)
        return ["127.0.0.1"]

    monkeypatch.setattr(NetworkPolicy, "resolve", slow)
    limits = FetchLimits(connect_timeout_s=0.2, read_timeout_s=1, total_timeout_s=3)
    started = time.monotonic()
    result = fetch("http://slow-dns.test/", limits=limits)
    assert result.error_class == "connect_timeout"
    assert time.monotonic() - started < 4.5, "the fetch waited for the 5 s resolver"


def test_dns_failure_is_dns_error(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_such_name(self: NetworkPolicy, host: str, port: int) -> list[str]:
        raise ResolutionFailed(host, "Name or service not known")

    monkeypatch.setattr(NetworkPolicy, "resolve", no_such_name)
    result = fetch("http://nowhere.invalid/")
    assert result.error_class == "dns_error"
    assert "nowhere.invalid" in result.error_detail


def test_closed_port_is_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = fetch(f"http://127.0.0.1:{port}/")
    assert result.error_class == "connect_error"
    assert result.remote_ip == "127.0.0.1"


def test_bad_url_is_invalid_url() -> None:
    assert fetch("ftp://127.0.0.1/").error_class == "invalid_url"
    assert fetch("http://[::1/").error_class == "invalid_url"


# --- responses ---------------------------------------------------------------------------------


def test_200_html_with_honest_user_agent(serve: Callable[..., TestServer]) -> None:
    server = serve({"/page": lambda h: h.reply(200, HTML, headers={"ETag": '"v1"', "Last-Modified": "x"})})
    result = fetch(server.url("/page"))
    assert result.ok
    assert (result.status, result.reason, result.http_version) == (200, "OK", "HTTP/1.1")
    assert result.body == HTML
    assert result.content_type == "text/html"
    assert (result.raw_bytes, result.decoded_bytes) == (len(HTML), len(HTML))
    assert result.etag == '"v1"' and result.last_modified == "x"
    assert 0 < result.response_s <= result.total_s
    assert server.seen[0][1]["user-agent"] == UA
    assert ("User-Agent", UA) in result.request_headers
    assert result.header("content-length") == str(len(HTML))


def test_kept_alive_connections_are_reused_until_the_server_closes_one() -> None:
    """Two fetches share one connection, reporting its address each time; after the server closed the connection
    (without saying so in its response), the pool sees the idle socket readable and the next fetch connects anew."""
    closed = threading.Event()

    class Closing(TestServer):
        def shutdown_request(self, request: Any) -> None:
            super().shutdown_request(request)
            closed.set()

    def last(h: Handler) -> None:
        h.reply(200, HTML)
        h.close_connection = True

    server = Closing("127.0.0.1", {"/page": lambda h: h.reply(200, HTML), "/last": last})
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:

        async def go() -> list[FetchResult]:
            async with Fetcher(LOOPBACK, UA, FAST) as fetcher:
                results = [await fetcher.fetch(server.url("/page")), await fetcher.fetch(server.url("/last"))]
                assert server.accepted == 1
                assert await asyncio.to_thread(closed.wait, 5)
                results.append(await fetcher.fetch(server.url("/page")))
                return results

        results = asyncio.run(go())
    finally:
        server.shutdown()
        server.server_close()
    assert [r.status for r in results] == [200, 200, 200], [r.error_detail for r in results]
    assert [r.remote_ip for r in results] == ["127.0.0.1"] * 3
    assert server.accepted == 2


def test_404_is_a_response_not_an_error(serve: Callable[..., TestServer]) -> None:
    server = serve({})
    result = fetch(server.url("/missing"))
    assert (result.status, result.error_class) == (404, "")
    assert result.body == b"<p>not found</p>"


def test_301_is_reported_not_followed(serve: Callable[..., TestServer]) -> None:
    server = serve(
        {
            "/old": lambda h: h.reply(301, b"", headers={"Location": "/new"}),
            "/new": lambda h: h.reply(200, HTML),
        }
    )
    result = fetch(server.url("/old"))
    assert (result.status, result.location, result.error_class) == (301, "/new", "")
    assert [path for path, _ in server.seen] == ["/old"]


def test_429_retry_after_seconds_and_http_date(serve: Callable[..., TestServer]) -> None:
    later = email.utils.formatdate(time.time() + 120, usegmt=True)
    server = serve(
        {
            "/s": lambda h: h.reply(429, b"", headers={"Retry-After": "30"}),
            "/d": lambda h: h.reply(429, b"", headers={"Retry-After": later}),
            "/bad": lambda h: h.reply(429, b"", headers={"Retry-After": "soon"}),
        }
    )
    assert fetch(server.url("/s")).retry_after_s == 30.0
    dated = fetch(server.url("/d"))
    assert dated.status == 429
    assert 115 <= dated.retry_after_s <= 121
    assert fetch(server.url("/bad")).retry_after_s == -1.0
    assert fetch(server.url("/missing")).retry_after_s == -1.0


def test_parse_retry_after() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("0") == 0.0
    assert parse_retry_after(" 7 ") == 7.0
    assert parse_retry_after("-5") == -1.0
    assert parse_retry_after("") == -1.0
    assert parse_retry_after(email.utils.formatdate(now + 60, usegmt=True), now=now) == 60.0
    assert parse_retry_after(email.utils.formatdate(now - 60, usegmt=True), now=now) == 0.0


def test_conditional_get_sends_validators(serve: Callable[..., TestServer]) -> None:
    def conditional(h: Handler) -> None:
        if h.headers.get("If-None-Match") == '"v1"':
            h.send_response(304)
            h.send_header("ETag", '"v1"')
            h.end_headers()
        else:
            h.reply(200, HTML, headers={"ETag": '"v1"'})

    server = serve({"/c": conditional})
    result = fetch(server.url("/c"), etag='"v1"', last_modified="Wed, 21 Oct 2015 07:28:00 GMT")
    assert (result.status, result.body, result.error_class) == (304, b"", "")
    sent = server.seen[0][1]
    assert sent["if-none-match"] == '"v1"'
    assert sent["if-modified-since"] == "Wed, 21 Oct 2015 07:28:00 GMT"
    plain = fetch(server.url("/c"))
    assert plain.status == 200 and "if-none-match" not in server.seen[1][1]


def test_non_html_content_type_is_not_read(serve: Callable[..., TestServer]) -> None:
    server = serve({"/file.pdf": lambda h: h.reply(200, b"%PDF" + b"x" * 2_000_000, "application/pdf")})
    result = fetch(server.url("/file.pdf"))
    assert (result.status, result.error_class) == (200, "")
    assert result.body_skipped
    assert result.content_type == "application/pdf"
    assert (result.body, result.raw_bytes) == (b"", 0)


# --- content encodings and limits ----------------------------------------------------------------


@functools.cache
def zeros_bomb(encoding: str, size: int = 50 * 2**20) -> bytes:
    zeros = b"\0" * size
    if encoding == "gzip":
        return gzip.compress(zeros, compresslevel=6)
    if encoding == "deflate":
        return zlib.compress(zeros, 6)
    return bytes(brotli.compress(zeros, quality=5))


def encoded_route(body: bytes, encoding: str) -> Route:
    return lambda h: h.reply(200, body, headers={"Content-Encoding": encoding})


def test_encoded_bodies_are_decoded(serve: Callable[..., TestServer]) -> None:
    page = HTML * 50
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    raw_deflate = packer.compress(page) + packer.flush()
    server = serve(
        {
            "/gzip": encoded_route(gzip.compress(page), "gzip"),
            "/deflate": encoded_route(zlib.compress(page), "deflate"),
            "/raw-deflate": encoded_route(raw_deflate, "deflate"),
            "/br": encoded_route(brotli.compress(page), "br"),
            "/members": encoded_route(gzip.compress(page[:100]) + gzip.compress(page[100:]), "gzip"),
            "/stacked": encoded_route(brotli.compress(gzip.compress(page)), "gzip, br"),
        }
    )
    for path in ["/gzip", "/deflate", "/raw-deflate", "/br", "/members", "/stacked"]:
        result = fetch(server.url(path))
        assert (path, result.error_class, result.body) == (path, "", page)
        assert result.raw_bytes < result.decoded_bytes == len(page)


def test_undecodable_and_unknown_encodings_are_protocol_errors(serve: Callable[..., TestServer]) -> None:
    server = serve(
        {
            "/garbage": encoded_route(b"this is not gzip at all", "gzip"),
            "/zstd": encoded_route(b"\x28\xb5\x2f\xfd", "zstd"),
        }
    )
    for path in ["/garbage", "/zstd"]:
        result = fetch(server.url(path))
        assert (result.status, result.error_class, result.truncated) == (200, "protocol_error", "unspecified")
        assert "decoding" in result.error_detail


def test_too_large_stops_reading(serve: Callable[..., TestServer]) -> None:
    server = serve({"/big": lambda h: h.reply(200, b"<p>" + b"a" * 3_000_000)})
    limits = FetchLimits(connect_timeout_s=2, read_timeout_s=2, total_timeout_s=5, max_bytes=100_000)
    result = fetch(server.url("/big"), limits=limits)
    assert (result.status, result.error_class, result.truncated) == (200, "too_large", "length")
    assert result.raw_bytes == 100_000
    assert result.body == (b"<p>" + b"a" * 3_000_000)[:100_000]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_decompression_bombs_are_cut_off_in_bounded_memory(serve: Callable[..., TestServer], encoding: str) -> None:
    bomb = zeros_bomb(encoding)
    server = serve({"/bomb": encoded_route(bomb, encoding)})
    limits = FetchLimits(connect_timeout_s=2, read_timeout_s=2, total_timeout_s=5, max_decoded_bytes=2**20)
    tracemalloc.start()
    try:
        result = fetch(server.url("/bomb"), limits=limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (result.status, result.error_class, result.truncated) == (200, "decompression_bomb", "length")
    assert result.decoded_bytes == 2**20 and result.body == b"\0" * 2**20
    assert result.raw_bytes <= len(bomb)
    # Unbounded decoding holds the whole 50 MiB (httpx's own decoders peak near 127 MiB on the first
    # 64 KiB chunk); with the bound the peak is about twice the 1 MiB limit (buffer + final bytes).
    assert peak < 8 * 2**20, f"peak traced memory {peak / 2**20:.1f} MiB"


def test_trickling_server_is_cut_off_by_the_total_timeout(serve: Callable[..., TestServer]) -> None:
    def trickle(h: Handler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/html")
        h.send_header("Content-Length", "100")
        h.end_headers()
        h.wfile.flush()
        for _ in range(20):  # at most 6 s, and it stops as soon as the client hangs up
            h.wfile.write(b"a")
            h.wfile.flush()
            time.sleep(0.3)

    server = serve({"/slow": trickle})
    limits = FetchLimits(connect_timeout_s=1, read_timeout_s=1.0, total_timeout_s=1.5)
    result = fetch(server.url("/slow"), limits=limits)
    assert (result.status, result.error_class, result.truncated) == (200, "total_timeout", "time")
    assert 1 <= len(result.body) <= 6  # cut off well before the 20 bytes the server would trickle


def test_silent_server_is_a_read_timeout(serve: Callable[..., TestServer]) -> None:
    server = serve({"/hang": lambda h: time.sleep(1.0)})
    limits = FetchLimits(connect_timeout_s=1, read_timeout_s=0.3, total_timeout_s=3)
    result = fetch(server.url("/hang"), limits=limits)
    assert (result.status, result.error_class) == (0, "read_timeout")


def test_connection_dropped_mid_body_is_reported(serve: Callable[..., TestServer]) -> None:
    def short(h: Handler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/html")
        h.send_header("Content-Length", "1000")
        h.end_headers()
        h.wfile.write(b"<p>only a part")
        h.close_connection = True

    server = serve({"/short": short})
    result = fetch(server.url("/short"))
    assert result.status == 200
    assert result.error_class in ("protocol_error", "network_error")
    assert result.truncated == "disconnect"
    assert result.body == b"<p>only a part"


# --- robots.txt redirects ------------------------------------------------------------------------

ROBOTS = b"User-agent: *\nDisallow: /private\n"


def robots_routes(hops: int, final: Route | None = None) -> dict[str, Route]:
    routes: dict[str, Route] = {}
    for n in range(hops, 0, -1):
        target = f"/r{n - 1}" if n > 1 else "/robots.txt"
        routes[f"/r{n}"] = functools.partial(lambda h, t: h.reply(302, b"", headers={"Location": t}), t=target)
    routes["/robots.txt"] = final or (lambda h: h.reply(200, ROBOTS, "text/plain"))
    return routes


def test_robots_follows_three_hops(serve: Callable[..., TestServer]) -> None:
    server = serve(robots_routes(3))
    result = fetch(server.url("/r3"), robots=True)
    assert (result.status, result.error_class, result.body) == (200, "", ROBOTS)
    assert result.url == server.url("/robots.txt")
    assert result.redirects == [server.url("/r3"), server.url("/r2"), server.url("/r1")]


def test_robots_follows_five_hops_and_gives_up_past_five(serve: Callable[..., TestServer]) -> None:
    server = serve(robots_routes(6))
    assert fetch(server.url("/r5"), robots=True).body == ROBOTS
    result = fetch(server.url("/r6"), robots=True)
    assert (result.status, result.error_class) == (302, "too_many_redirects")
    assert len(result.redirects) == 5
    assert "/robots.txt" not in [path for path, _ in server.seen[-6:]]


def test_robots_hop_to_a_refused_address_is_network_policy(serve: Callable[..., TestServer]) -> None:
    other = serve({"/robots.txt": lambda h: h.reply(200, ROBOTS, "text/plain")}, host="127.0.0.2")
    server = serve({"/robots.txt": lambda h: h.reply(301, b"", headers={"Location": other.url("/robots.txt")})})
    result = fetch(server.url("/robots.txt"), policy=NetworkPolicy(allow=["127.0.0.1/32"]), robots=True)
    assert result.error_class == "network_policy"
    assert result.url == other.url("/robots.txt")
    assert other.accepted == 0


def test_robots_redirect_to_other_scheme_is_invalid_url(serve: Callable[..., TestServer]) -> None:
    server = serve({"/robots.txt": lambda h: h.reply(301, b"", headers={"Location": "ftp://x/robots.txt"})})
    assert fetch(server.url("/robots.txt"), robots=True).error_class == "invalid_url"


def test_robots_body_is_read_whatever_the_content_type(serve: Callable[..., TestServer]) -> None:
    server = serve({"/robots.txt": lambda h: h.reply(200, ROBOTS, "application/octet-stream")})
    result = fetch(server.url("/robots.txt"), robots=True)
    assert result.body == ROBOTS and not result.body_skipped


# --- TLS: connect to the checked IP, verify and send SNI for the hostname ------------------------


@pytest.fixture(scope="module")
def localhost_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl command not available")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    return cert, key


def test_tls_uses_hostname_for_sni_and_verification(
    serve: Callable[..., TestServer], localhost_cert: tuple[Path, Path]
) -> None:
    cert, key = localhost_cert
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    sni: list[str | None] = []
    server_ctx.sni_callback = lambda sock, name, ctx: sni.append(name)
    server = serve({"/": lambda h: h.reply(200, HTML)}, tls=server_ctx)
    trusting = ssl.create_default_context(cafile=str(cert))

    result = fetch(server.url("/", host="localhost"), fetcher_kwargs={"ssl_context": trusting})
    assert (result.status, result.error_class, result.remote_ip) == (200, "", "127.0.0.1")
    assert sni == ["localhost"]

    # The certificate names localhost, not the IP: verification is against the URL's host.
    by_ip = fetch(server.url("/"), fetcher_kwargs={"ssl_context": trusting})
    assert by_ip.error_class == "tls_error"
    # Default trust store: a self-signed certificate is refused.
    assert fetch(server.url("/", host="localhost")).error_class == "tls_error"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/plain?q=1", "/plain?q=1"),
        ("/caf\u00c3\u00a9", "/caf\u00e9"),  # UTF-8 bytes on the wire, read as latin-1 by the header decoding
        ("/caf\u00e9?q=\u00ff", "/caf%E9?q=%FF"),  # not UTF-8: each byte percent-encoded as it is
        ("/%C3%A9", "/%C3%A9"),
    ],
)
def test_location_bytes_past_ascii_are_utf8_or_percent_encoded(value: str, expected: str) -> None:
    assert location_text(value) == expected
