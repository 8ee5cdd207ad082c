"""One safe HTTP fetch: SSRF-checked connects, hard limits, and a result instead of an exception.

Safety is enforced below httpx, in the connection pool's network backend
(`transport.PolicyBackend`, installed through httpx's public custom-transport
seam, `transport.PolicyTransport`): every TCP connect resolves the hostname itself, checks every
resolved address against the `NetworkPolicy`, and then connects to the checked
IP literal. The name is never resolved a second time, so DNS rebinding cannot
swap the address between check and connect; TLS still uses the hostname for
SNI and certificate verification because httpcore passes `server_hostname`
from the request origin, not from the address we connected to.

Limits are enforced while streaming:

* raw (on-the-wire, de-chunked) body bytes over `max_bytes` -> "too_large";
* decoded bytes over `max_decoded_bytes` -> "decompression_bomb". Content
  decoding is done here, not by httpx: httpx's decoders inflate each network
  chunk in a single call, and 89 bytes of brotli already expand to 50 MB, so
  the whole bomb would sit in memory before anyone could count it. The
  decoders below emit at most ~64 KiB per step (zlib `max_length`, brotli >= 1.2
  `output_buffer_limit`), so reading stops within one step of the limit;
* one asyncio timeout around the whole exchange -> "total_timeout", which is
  what cuts off a server trickling one byte at a time under the read timeout.

Network problems never raise: `Fetcher.fetch` always returns a `FetchResult`
whose `error_class` is one of the constants below ("" for a complete response).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import zlib
from collections.abc import AsyncGenerator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import brotli
import httpx

from fetch_worker.netpolicy import AddressRefused, NetworkPolicy, ResolutionFailed
from fetch_worker.transport import CONNECT_TRACE, ConnectTrace, policy_transport
from hostring.html import HTML_TYPES, media_type
from hostring.retry_after import parse_retry_after

# Error classes: the complete vocabulary of FetchResult.error_class.
NETWORK_POLICY = "network_policy"
DNS_ERROR = "dns_error"
CONNECT_ERROR = "connect_error"
CONNECT_TIMEOUT = "connect_timeout"
TLS_ERROR = "tls_error"
WRITE_TIMEOUT = "write_timeout"
READ_TIMEOUT = "read_timeout"
TOTAL_TIMEOUT = "total_timeout"
NETWORK_ERROR = "network_error"
PROTOCOL_ERROR = "protocol_error"
TOO_LARGE = "too_large"
DECOMPRESSION_BOMB = "decompression_bomb"
TOO_MANY_REDIRECTS = "too_many_redirects"
INVALID_URL = "invalid_url"

ERROR_CLASSES = frozenset(
    {
        NETWORK_POLICY,
        DNS_ERROR,
        CONNECT_ERROR,
        CONNECT_TIMEOUT,
        TLS_ERROR,
        WRITE_TIMEOUT,
        READ_TIMEOUT,
        TOTAL_TIMEOUT,
        NETWORK_ERROR,
        PROTOCOL_ERROR,
        TOO_LARGE,
        DECOMPRESSION_BOMB,
        TOO_MANY_REDIRECTS,
        INVALID_URL,
    }
)

# FetchResult.truncated values: the WARC-Truncated reason tokens (WARC 1.1 §5.13).
TRUNCATED_LENGTH = "length"
TRUNCATED_TIME = "time"
TRUNCATED_DISCONNECT = "disconnect"
TRUNCATED_UNSPECIFIED = "unspecified"

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})

_STEP = 64 * 1024
_MAX_ENCODINGS = 3
_BROTLI_BOUNDED = hasattr(brotli.Decompressor(), "can_accept_more_data")
# Only what can be decoded with bounded memory is advertised.
ACCEPT_ENCODING = "gzip, deflate, br" if _BROTLI_BOUNDED else "gzip, deflate"
_ACCEPT_PAGE = "text/html,application/xhtml+xml;q=0.9,*/*;q=0.5"
_ACCEPT_ROBOTS = "text/plain,*/*;q=0.5"


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """Per-fetch bounds. Sizes are bytes, times seconds."""

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 20.0
    total_timeout_s: float = 60.0
    max_bytes: int = 10 * 2**20
    max_decoded_bytes: int = 20 * 2**20
    parse_types: tuple[str, ...] = HTML_TYPES
    max_redirect_hops_robots: int = 5


DEFAULT_LIMITS = FetchLimits()


def body_limits(max_bytes: int, total_timeout_s: float) -> FetchLimits:
    """The limits of an operator's body cap (`--max-response-bytes`): a decoded body may be twice the cap, and at
    least the default, before it counts as a decompression bomb."""
    return FetchLimits(
        total_timeout_s=total_timeout_s,
        max_bytes=max_bytes,
        max_decoded_bytes=max(max_bytes * 2, DEFAULT_LIMITS.max_decoded_bytes),
    )


@dataclass(slots=True)
class FetchResult:
    """What one fetch produced; enough for Complete, link extraction and a WARC record.

    `status` is 0 when no response arrived. `error_class` is "" for a complete
    response; when it names a body-level failure (too_large,
    decompression_bomb, total_timeout, ...) after headers arrived, `status`
    and headers are kept and `body` holds what was read, with `truncated`
    saying why ("length", "time", "disconnect"). `body` is always decoded
    (Content-Encoding removed). `body_skipped` is True when the content type
    is not one to parse and the body was deliberately not read.
    `location` is the Location header as sent (resolve it against `url`), its bytes past ASCII read as
    UTF-8, or percent-encoded when they are not UTF-8 (location_text).
    `response_s` is time to response headers, `total_s` the whole fetch.
    `redirects` lists the URLs that redirected, for `fetch_robots` only.
    """

    url: str
    status: int = 0
    reason: str = ""
    error_class: str = ""
    error_detail: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = field(default=b"", repr=False)  # up to 20 MiB: never in logs via repr()
    content_type: str = ""
    raw_bytes: int = 0
    decoded_bytes: int = 0
    truncated: str = ""
    body_skipped: bool = False
    started_at: float = 0.0
    response_s: float = 0.0
    total_s: float = 0.0
    remote_ip: str = ""
    retry_after_s: float = -1.0
    location: str = ""
    etag: str = ""
    last_modified: str = ""
    http_version: str = ""
    method: str = "GET"
    request_headers: list[tuple[str, str]] = field(default_factory=list)
    request_target: str = ""
    """The request-target as sent (percent-encoded path and query), for the WARC request record; "" if unknown."""
    redirects: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """A response arrived and its body (if wanted) was read completely."""
        return self.status != 0 and not self.error_class

    def header(self, name: str, default: str = "") -> str:
        """First value of response header `name` (case-insensitive)."""
        wanted = name.lower()
        for key, value in self.headers:
            if key.lower() == wanted:
                return value
        return default

    def header_values(self, name: str) -> list[str]:
        """Every value of response header `name`, in order."""
        wanted = name.lower()
        return [value for key, value in self.headers if key.lower() == wanted]


# --- bounded content decoding -------------------------------------------------------------------


class _DecodeError(Exception):
    """The body does not decode with its declared Content-Encoding."""


class _Decoder(Protocol):
    def feed(self, data: bytes) -> Iterator[bytes]: ...

    def finish(self) -> Iterator[bytes]: ...


class _Identity:
    def feed(self, data: bytes) -> Iterator[bytes]:
        if data:
            yield data

    def finish(self) -> Iterator[bytes]:
        return iter(())


class _Zlib:
    """gzip (several members allowed) or deflate (zlib-wrapped, or raw as some servers send it)."""

    def __init__(self, gzip: bool) -> None:
        self._gzip = gzip
        self._head = b""
        self._d: Any = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzip else None
        self._members = 0
        self._done = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._d is None:
            # Deflate: zlib header or raw stream? Decide on the first two bytes (RFC 1950 §2.2).
            self._head += data
            if len(self._head) < 2:
                return
            cmf, flg = self._head[0], self._head[1]
            zlib_wrapped = cmf & 0x0F == 8 and (cmf * 256 + flg) % 31 == 0
            self._d = zlib.decompressobj(zlib.MAX_WBITS if zlib_wrapped else -zlib.MAX_WBITS)
            data, self._head = self._head, b""
        yield from self._pump(data)

    def _pump(self, data: bytes) -> Iterator[bytes]:
        while not self._done:
            try:
                out = self._d.decompress(data, _STEP)
            except zlib.error as exc:
                if self._members:
                    self._done = True  # garbage after a complete gzip member is ignored
                    return
                raise _DecodeError(f"{'gzip' if self._gzip else 'deflate'}: {exc}") from None
            data = self._d.unconsumed_tail
            if out:
                yield out
            if self._d.eof:
                rest = self._d.unused_data
                self._members += 1
                if not self._gzip:
                    self._done = True
                    return
                self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                data = rest
                if not data:
                    return
                continue
            if not data and len(out) < _STEP:
                return

    def finish(self) -> Iterator[bytes]:
        if self._d is None:
            if self._head:
                raise _DecodeError("deflate: truncated stream")
            return
        yield from self._pump(b"")


class _Brotli:
    """Brotli with a bounded output buffer (brotli >= 1.2)."""

    def __init__(self) -> None:
        self._d = brotli.Decompressor()

    def feed(self, data: bytes) -> Iterator[bytes]:
        if not data or self._d.is_finished():
            return
        try:
            out = self._d.process(data, output_buffer_limit=_STEP)
            if out:
                yield out
            while not self._d.can_accept_more_data():
                out = self._d.process(b"", output_buffer_limit=_STEP)
                if out:
                    yield out
        except brotli.error as exc:
            raise _DecodeError(f"br: {exc}") from None

    def finish(self) -> Iterator[bytes]:
        return iter(())


class _Chain:
    """Decoders applied in reverse order of the Content-Encoding list, each step bounded."""

    def __init__(self, decoders: list[_Decoder]) -> None:
        self._decoders = decoders

    def _through(self, index: int, data: bytes) -> Iterator[bytes]:
        if index == len(self._decoders):
            if data:
                yield data
            return
        for piece in self._decoders[index].feed(data):
            yield from self._through(index + 1, piece)

    def feed(self, data: bytes) -> Iterator[bytes]:
        return self._through(0, data)

    def finish(self) -> Iterator[bytes]:
        for index, decoder in enumerate(self._decoders):
            for piece in decoder.finish():
                yield from self._through(index + 1, piece)


def _decoder_for(content_encoding: str) -> tuple[_Decoder, bool]:
    """A decoder for a Content-Encoding header value, and whether any coding is applied."""
    tokens = [t.strip().lower() for t in content_encoding.split(",")]
    tokens = [t for t in tokens if t and t != "identity"]
    if not tokens:
        return _Identity(), False
    if len(tokens) > _MAX_ENCODINGS:
        raise _DecodeError(f"too many content codings: {content_encoding!r}")
    decoders: list[_Decoder] = []
    for token in reversed(tokens):
        if token in ("gzip", "x-gzip"):
            decoders.append(_Zlib(gzip=True))
        elif token == "deflate":
            decoders.append(_Zlib(gzip=False))
        elif token == "br" and _BROTLI_BOUNDED:
            decoders.append(_Brotli())
        else:
            raise _DecodeError(f"unsupported content coding {token!r}")
    return (decoders[0] if len(decoders) == 1 else _Chain(decoders)), True


# --- the fetcher --------------------------------------------------------------------------------


class _Stop(Exception):
    """A limit stopped the body read."""

    def __init__(self, error_class: str, detail: str) -> None:
        super().__init__(detail)
        self.error_class = error_class


@dataclass(slots=True)
class _Progress:
    body: bytearray = field(default_factory=bytearray)
    raw: int = 0
    reading_body: bool = False


def _in_chain(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _classify(exc: Exception) -> tuple[str, str]:
    """(error_class, detail) for an exception out of a fetch; re-raises what is not a network problem."""
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, AddressRefused):
        return NETWORK_POLICY, detail
    if isinstance(exc, ResolutionFailed):
        return DNS_ERROR, detail
    if isinstance(exc, _Stop):
        return exc.error_class, detail
    if isinstance(exc, _DecodeError):
        return PROTOCOL_ERROR, f"content decoding failed: {detail}"
    if isinstance(exc, httpx.ConnectTimeout):
        return CONNECT_TIMEOUT, detail
    if isinstance(exc, httpx.WriteTimeout):
        return WRITE_TIMEOUT, detail
    if isinstance(exc, httpx.TimeoutException):
        return READ_TIMEOUT, detail
    if isinstance(exc, httpx.ConnectError):
        return (TLS_ERROR if _in_chain(exc, ssl.SSLError) else CONNECT_ERROR), detail
    if isinstance(exc, httpx.NetworkError):
        return (TLS_ERROR if _in_chain(exc, ssl.SSLError) else NETWORK_ERROR), detail
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return INVALID_URL, detail
    if isinstance(exc, httpx.HTTPError):
        return PROTOCOL_ERROR, detail
    if isinstance(exc, ssl.SSLError):
        return TLS_ERROR, detail
    if isinstance(exc, OSError):
        return CONNECT_ERROR, detail
    raise exc


def _truncation_for(error_class: str) -> str:
    if error_class in (TOO_LARGE, DECOMPRESSION_BOMB):
        return TRUNCATED_LENGTH
    if error_class in (TOTAL_TIMEOUT, READ_TIMEOUT):
        return TRUNCATED_TIME
    return TRUNCATED_DISCONNECT


def _latin1(pairs: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in pairs]


def location_text(value: str) -> str:
    """A Location header value (kept as latin-1 text, byte for byte) as the URL reference it names.

    Bytes past ASCII are read as UTF-8 when they are UTF-8 (a server sending `/café` raw means the
    resource `/caf%C3%A9`, not the latin-1 mojibake `/cafÃ©`), else each is percent-encoded as it is
    (`/caf\\xe9` is `/caf%E9`), as browsers resolve a redirect.
    """
    if value.isascii():
        return value
    raw = value.encode("latin-1", "replace")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(chr(b) if b < 0x80 else f"%{b:02X}" for b in raw)


class Fetcher:
    """Fetches URLs one GET at a time over a shared, policy-guarded connection pool.

    `user_agent` is sent on every request and must not be empty. Redirects are
    never followed by `fetch` (each hop goes back to the frontier);
    `fetch_robots` follows up to `limits.max_redirect_hops_robots` hops itself
    (RFC 9309 §2.3.1.2), every hop connecting through the same policy check.
    `ssl_context` replaces the default (certifi roots, hostname checked),
    e.g. for an operator CA or for tests. Keep concurrent fetches at or below
    `max_connections`: waiting for a pooled connection has no timeout of its
    own and counts against `total_timeout_s`.
    """

    def __init__(
        self,
        policy: NetworkPolicy,
        user_agent: str,
        limits: FetchLimits = DEFAULT_LIMITS,
        max_connections: int = 100,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if not user_agent.strip():
            raise ValueError("an honest, non-empty User-Agent is required")
        self.policy = policy
        self.user_agent = user_agent
        self.limits = limits
        context = ssl_context if ssl_context is not None else httpx.create_ssl_context(trust_env=False)
        self._client = httpx.AsyncClient(
            transport=policy_transport(policy, context, max_connections),
            trust_env=False,
            follow_redirects=False,
            timeout=httpx.Timeout(
                connect=limits.connect_timeout_s,
                read=limits.read_timeout_s,
                write=limits.read_timeout_s,
                pool=None,
            ),
            headers={"User-Agent": user_agent, "Accept-Encoding": ACCEPT_ENCODING},
        )

    async def aclose(self) -> None:
        """Close pooled connections."""
        await self._client.aclose()

    async def __aenter__(self) -> Fetcher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def fetch(self, url: str, *, etag: str = "", last_modified: str = "") -> FetchResult:
        """GET `url` once, without following redirects; conditional when a validator is given."""
        headers = {"Accept": _ACCEPT_PAGE}
        if etag:
            headers["If-None-Match"] = etag
        if last_modified:
            headers["If-Modified-Since"] = last_modified
        return await self._fetch_once(url, headers, read_any=False, deadline=None)

    async def fetch_robots(self, url: str, *, follow: bool = True) -> FetchResult:
        """GET a robots.txt, following up to the hop limit; `result.url` is the final URL.

        The whole chain shares one total timeout. A redirect to a non-HTTP(S)
        URL ends with "invalid_url"; one hop too many with "too_many_redirects"
        (the frontier then treats robots as unreachable or allow-all per RFC 9309).
        With `follow=False` a redirect is returned as it is (status and Location), so the frontier can pace
        each hop by its own host, as the fetch worker does.
        """
        deadline = time.monotonic() + self.limits.total_timeout_s
        headers = {"Accept": _ACCEPT_ROBOTS}
        redirects: list[str] = []
        current = url
        while True:
            result = await self._fetch_once(current, headers, read_any=True, deadline=deadline)
            result.redirects = list(redirects)
            if result.error_class or result.status not in REDIRECT_STATUSES or not result.location or not follow:
                return result
            if len(redirects) >= self.limits.max_redirect_hops_robots:
                result.error_class = TOO_MANY_REDIRECTS
                result.error_detail = f"more than {self.limits.max_redirect_hops_robots} redirect hops"
                return result
            try:
                target = httpx.URL(current).join(result.location)
            except httpx.InvalidURL as exc:
                result.error_class, result.error_detail = INVALID_URL, f"bad Location: {exc}"
                return result
            if target.scheme not in ("http", "https"):
                result.error_class = INVALID_URL
                result.error_detail = f"redirect to unsupported scheme: {result.location!r}"
                return result
            redirects.append(current)
            current = str(target.copy_with(fragment=None))

    async def _fetch_once(
        self, url: str, headers: dict[str, str], *, read_any: bool, deadline: float | None
    ) -> FetchResult:
        result = FetchResult(url=url, started_at=time.time())
        progress = _Progress()
        trace = ConnectTrace()
        token = CONNECT_TRACE.set(trace)
        t0 = time.monotonic()
        budget = self.limits.total_timeout_s if deadline is None else max(0.0, deadline - t0)
        scope = asyncio.timeout(budget)
        try:
            async with scope:
                await self._exchange(url, headers, read_any, result, progress, t0)
        except TimeoutError as exc:
            if scope.expired():
                result.error_class = TOTAL_TIMEOUT
                result.error_detail = f"fetch took longer than {budget:.3g}s in total"
            else:
                result.error_class = READ_TIMEOUT if result.status else CONNECT_TIMEOUT
                result.error_detail = str(exc) or "timed out"
        except Exception as exc:
            result.error_class, result.error_detail = _classify(exc)
            if isinstance(exc, AddressRefused):
                trace.remote_ip = exc.address
            elif isinstance(exc, _DecodeError):
                result.truncated = TRUNCATED_UNSPECIFIED
        finally:
            CONNECT_TRACE.reset(token)
        if result.error_class and progress.reading_body and not result.truncated:
            result.truncated = _truncation_for(result.error_class)
        if not result.remote_ip:
            result.remote_ip = trace.remote_ip
        result.body = bytes(progress.body)
        result.raw_bytes = progress.raw
        result.decoded_bytes = len(progress.body)
        result.total_s = time.monotonic() - t0
        return result

    async def _exchange(
        self,
        url: str,
        headers: dict[str, str],
        read_any: bool,
        result: FetchResult,
        progress: _Progress,
        t0: float,
    ) -> None:
        request = self._client.build_request("GET", url, headers=headers)
        result.request_headers = _latin1(request.headers.raw)
        result.request_target = request.url.raw_path.decode("ascii", "replace")
        response = await self._client.send(request, stream=True)
        try:
            result.response_s = time.monotonic() - t0
            self._record_response(result, response)
            if read_any or result.content_type in self.limits.parse_types:
                progress.reading_body = True
                await self._read_body(response, progress)
            else:
                result.body_skipped = True
        finally:
            await response.aclose()

    def _record_response(self, result: FetchResult, response: httpx.Response) -> None:
        result.status = response.status_code
        result.reason = response.reason_phrase
        result.http_version = response.http_version
        result.headers = _latin1(response.headers.raw)
        result.content_type = media_type(result.header("content-type"))
        result.location = location_text(result.header("location"))
        result.etag = result.header("etag")
        result.last_modified = result.header("last-modified")
        result.retry_after_s = parse_retry_after(result.header("retry-after"))
        stream = response.extensions.get("network_stream")
        server_addr = stream.get_extra_info("server_addr") if stream is not None else None
        if server_addr:
            result.remote_ip = str(server_addr[0])

    async def _read_body(self, response: httpx.Response, progress: _Progress) -> None:
        decoder, encoded = _decoder_for(response.headers.get("content-encoding", ""))
        max_bytes = self.limits.max_bytes
        raw = cast(AsyncGenerator[bytes, None], response.aiter_raw())  # an async generator in httpx
        async with contextlib.aclosing(raw) as chunks:
            async for chunk in chunks:
                over = progress.raw + len(chunk) - max_bytes
                if over > 0:
                    chunk = chunk[: len(chunk) - over]
                    progress.raw += len(chunk)
                    self._take(decoder.feed(chunk), progress, encoded)
                    raise _Stop(TOO_LARGE, f"body exceeds {max_bytes} bytes on the wire")
                progress.raw += len(chunk)
                self._take(decoder.feed(chunk), progress, encoded)
        self._take(decoder.finish(), progress, encoded)

    def _take(self, pieces: Iterator[bytes], progress: _Progress, encoded: bool) -> None:
        limit = self.limits.max_decoded_bytes
        body = progress.body
        for piece in pieces:
            room = limit - len(body)
            if len(piece) > room:
                body += piece[:room]
                if encoded:
                    raise _Stop(DECOMPRESSION_BOMB, f"body decodes to more than {limit} bytes")
                raise _Stop(TOO_LARGE, f"body exceeds {limit} bytes")
            body += piece
