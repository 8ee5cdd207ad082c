"""A local multi-origin web on loopback: what end-to-end tests, benchmarks and `hostring demo` crawl.

Every origin gets its own loopback address (127.0.0.2, 127.0.0.3, ...) on one shared port, so "one host per
origin" holds for politeness. All origins are served by one asyncio event loop in a background thread, which
starts hundreds of origins in milliseconds and handles concurrent connections, so the request log can *detect*
a crawler that overlaps requests to one host or comes back too soon.

Placeholders. Sites are written before ports are known, so bodies and header values may contain:

- ``{{origin:LABEL}}``       -> ``http://127.0.0.N:PORT`` (no ``:80`` when the web runs on port 80)
- ``{{origin:LABEL|upper}}`` -> the same with an upper-case scheme, ``HTTP://...`` (IP literals have no case)
- ``{{origin:LABEL|port}}``  -> the same with an explicit port, ``http://127.0.0.N:80`` on port 80 (a default
  port spelling); on any other port it is identical to the plain form
- ``{{host:LABEL}}``         -> ``127.0.0.N:PORT`` (for scheme-relative ``//host/path`` links)

They are substituted at serve time in every body without a Content-Encoding and in every header value.

Identity. The server maps a request target to the page it names the way real servers do (percent-encoded
unreserved characters decoded, hex case ignored, dot segments removed, ``utm_*`` parameters and fragments
ignored); each Hit records both the raw target (``path``) and the page it resolved to (``resource``), so
``duplicates()`` catches a crawler that fetched one page under two spellings.

Generated webs. ``random_web`` builds a ``WebModel`` (pages keyed by ``(label, path)``, links, robots,
traps), renders it into ``Site`` objects with varied link spellings, and computes an ``Oracle`` by
brute-force BFS over the model itself, never by parsing the rendered HTML or by calling hostring code.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import html
import ipaddress
import itertools
import json
import logging
import math
import random
import re
import signal
import sys
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from email.utils import formatdate
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

import brotli

__all__ = [
    "Hit",
    "LinkSpec",
    "LocalWeb",
    "Oracle",
    "Page",
    "PageSpec",
    "RobotsSpec",
    "Site",
    "WebModel",
    "bomb_page",
    "canonical_target",
    "compressed_page",
    "oracle_for",
    "random_model",
    "random_web",
    "redirect_page",
    "render_model",
    "robots_allowed",
    "robots_page",
    "sample_model",
    "sample_oracle",
    "sample_web",
]

Key = tuple[str, str]
"""A page's identity as the generator knows it: (origin label, path with query, in normal form)."""

HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
TRACKING_PREFIX = "utm_"

_LABEL_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_PLACEHOLDER_RE = re.compile(rb"\{\{(origin|host):([A-Za-z0-9_.\-]+)(?:\|(upper|port))?\}\}")
_PCT_RE = re.compile(r"%([0-9A-Fa-f]{2})")
_log = logging.getLogger(__name__)
_HEAD_LIMIT = 32 * 1024
_BODY_LIMIT = 1 << 20


# ----------------------------------------------------------------------------------------------------
# What a site is made of


@dataclass
class Page:
    """One resource of a site, served as given (after placeholder substitution)."""

    status: int = 200
    body: bytes = b""
    content_type: str = HTML
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    """Server-side think time before the status line is sent."""
    trickle_s: float = 0.0
    """If > 0 the body is sent one byte per trickle_s seconds: a slow-loris server."""
    encoding: str = ""
    """"gzip", "deflate" or "br": body is already compressed and sent with that Content-Encoding."""


@dataclass
class Site:
    """The pages of one origin; unknown paths are 404."""

    pages: dict[str, Page] = field(default_factory=dict)
    robots: Page | None = None
    """Served at /robots.txt; None means 404 (allow all)."""
    trap: str | None = None
    """Path prefix of an endless calendar: /trap/2024/01 links to /trap/2024/02 and /trap/2025/01, forever."""


@dataclass(frozen=True)
class Hit:
    """One request as the server saw it; times are Unix seconds taken by the server."""

    origin: str
    path: str
    method: str
    start: float
    end: float
    status: int
    user_agent: str
    concurrent: int
    """Requests in flight on this origin when this one started, itself included (1 = alone)."""
    label: str = ""
    resource: str = ""
    """The page the target resolved to (the generator's identity), e.g. /~a/x for /%7Ea/x?utm_source=y."""
    client: str = ""
    bytes_sent: int = 0
    complete: bool = True
    """False when the client went away or the web shut down before the response was fully written."""


def html_page(text: str, **kwargs: Any) -> Page:
    """An HTML page from a str body."""
    return Page(body=text.encode("utf-8"), **kwargs)


def robots_page(text: str, status: int = 200) -> Page:
    """A robots.txt file served as text/plain."""
    return Page(status=status, body=text.encode("utf-8"), content_type=TEXT)


def redirect_page(location: str, status: int = 301) -> Page:
    """A redirect; location may use placeholders such as {{origin:b}}/x."""
    return Page(status=status, headers={"Location": location}, content_type="")


def compressed_page(content: bytes, encoding: str = "gzip", content_type: str = HTML) -> Page:
    """A page whose body is sent compressed with the given Content-Encoding."""
    if encoding == "gzip":
        body = zlib.compress(content, 9, wbits=31)
    elif encoding == "deflate":
        body = zlib.compress(content, 9)
    elif encoding == "br":
        body = brotli.compress(content)
    else:
        raise ValueError(f"unsupported encoding {encoding!r}")
    return Page(body=body, encoding=encoding, content_type=content_type)


def bomb_page(encoding: str = "gzip", size: int = 1 << 30, content_type: str = HTML) -> Page:
    """A decompression bomb: `size` zero bytes compressed; built chunk by chunk so memory stays small."""
    chunk = bytes(1 << 20)
    parts: list[bytes] = []
    if encoding in ("gzip", "deflate"):
        comp = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
        feed, finish = comp.compress, comp.flush
    elif encoding == "br":
        bcomp = brotli.Compressor(quality=5)
        feed, finish = bcomp.process, bcomp.finish
    else:
        raise ValueError(f"unsupported encoding {encoding!r}")
    left = size
    while left > 0:
        parts.append(feed(chunk[: min(left, len(chunk))]))
        left -= len(chunk)
    parts.append(finish())
    return Page(body=b"".join(parts), encoding=encoding, content_type=content_type)


# ----------------------------------------------------------------------------------------------------
# URL identity as the server (and the generator) sees it


def _pct_normalize(s: str) -> str:
    """Upper-case percent-encoding hex and decode unreserved characters (RFC 3986 §6.2.2.1-2)."""

    def fix(m: re.Match[str]) -> str:
        ch = chr(int(m.group(1), 16))
        return ch if ch in UNRESERVED else "%" + m.group(1).upper()

    return _PCT_RE.sub(fix, s)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4."""
    out: list[str] = []
    inp = path
    while inp:
        if inp.startswith("../"):
            inp = inp[3:]
        elif inp.startswith(("./", "/./")):
            inp = inp[2:]
        elif inp == "/.":
            inp = "/"
        elif inp.startswith("/../"):
            inp = inp[3:]
            if out:
                out.pop()
        elif inp == "/..":
            inp = "/"
            if out:
                out.pop()
        elif inp in (".", ".."):
            inp = ""
        else:
            i = inp.find("/", 1 if inp.startswith("/") else 0)
            seg, inp = (inp, "") if i < 0 else (inp[:i], inp[i:])
            out.append(seg)
    return "".join(out)


def canonical_target(target: str) -> str:
    """The resource a request target names: normalized path, tracking (utm_*) params and fragment dropped."""
    target = target.split("#", 1)[0]
    path, sep, query = target.partition("?")
    path = _remove_dot_segments(_pct_normalize(path)) or "/"
    if not sep:
        return path
    kept = [p for p in query.split("&") if p and not _pct_normalize(p).lower().startswith(TRACKING_PREFIX)]
    return path + ("?" + _pct_normalize("&".join(kept)) if kept else "")


# ----------------------------------------------------------------------------------------------------
# The calendar trap


_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


def _trap_page(prefix: str, path: str) -> Page | None:
    """The calendar page at `path` under `prefix`, or None if `path` is not under it; malformed dates 404."""
    base = prefix.rstrip("/")
    if path in (base, base + "/"):
        return html_page(_calendar_html(base, None, None, "./" if path.endswith("/") else base + "/"))
    if not path.startswith(base + "/"):
        return None
    m = re.fullmatch(r"(\d{4,9})/(\d{2})", path[len(base) + 1 :])
    if m is None or not 1 <= int(m.group(2)) <= 12:
        return Page(status=404, body=b"<!DOCTYPE html><title>No such month</title>")
    return html_page(_calendar_html(base, int(m.group(1)), int(m.group(2)), ""))


def _calendar_html(base: str, year: int | None, month: int | None, index_ref: str) -> str:
    """One calendar page: new text and new links on every page, so it never ends."""
    if year is None or month is None:
        title, links = "Events calendar", [(index_ref + "2024/01", "January 2024")]
        seed = 0
    else:
        ny, nm = (year, month + 1) if month < 12 else (year + 1, 1)
        title = f"Events in {_MONTHS[month - 1]} {year}"
        links = [(f"../{ny}/{nm:02d}", f"{_MONTHS[nm - 1]} {ny}"), (f"../../{base.rsplit('/', 1)[-1]}/"
                 f"{year + 1}/{month:02d}", f"{_MONTHS[month - 1]} {year + 1}")]
        seed = year * 12 + month
    rng = random.Random(zlib.crc32(f"{base}|{seed}".encode()))
    items = "\n".join(f'<li><a href="{html.escape(h)}">{html.escape(t)}</a></li>' for h, t in links)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title></head>"
            f"<body>\n<h1>{title}</h1>\n<p>{_paragraph(rng, 40)}</p>\n<ul>\n{items}\n</ul>\n</body></html>\n")


# ----------------------------------------------------------------------------------------------------
# The servers


def _addresses(first: ipaddress.IPv4Address, n: int) -> list[str]:
    """n loopback addresses from `first`, skipping .0 and .255 host octets."""
    out: list[str] = []
    addr = int(first)
    while len(out) < n:
        ip = ipaddress.IPv4Address(addr)
        if ip not in ipaddress.IPv4Network("127.0.0.0/8"):
            raise ValueError(f"ran out of loopback addresses after {len(out)} origins")
        if addr & 0xFF not in (0, 255):
            out.append(str(ip))
        addr += 1
    return out


class LocalWeb:
    """Serves `sites` (keyed by label) on loopback, one address per origin; a context manager.

    ``port=0`` picks one free port shared by every origin (retried if another process holds it on one of the
    addresses); ``port=80`` makes origins port-less and gives ``{{origin:x|port}}`` its default-port meaning.
    ``log_path`` appends each Hit as a JSON line while serving (``write_log`` writes a snapshot any time).
    Idle keep-alive connections close after ``idle_timeout_s``, longer than httpx's 5 s keep-alive expiry,
    so the client closes first and no request races a server-side close.
    """

    def __init__(
        self,
        sites: Mapping[str, Site],
        *,
        port: int = 0,
        first_address: str = "127.0.0.2",
        log_path: str | Path | None = None,
        idle_timeout_s: float = 30.0,
    ) -> None:
        if not sites:
            raise ValueError("a web needs at least one site")
        for label in sites:
            if not _LABEL_RE.match(label):
                raise ValueError(f"bad site label {label!r}: use letters, digits, '_', '.', '-'")
        first = ipaddress.IPv4Address(first_address)
        if first not in ipaddress.IPv4Network("127.0.0.0/8"):
            raise ValueError("LocalWeb binds loopback addresses only (127.0.0.0/8)")
        self.sites: dict[str, Site] = dict(sites)
        self._check_placeholders()
        self._requested_port = port
        self._addresses = _addresses(first, len(self.sites))
        self._idle_timeout_s = idle_timeout_s
        self._log_path = Path(log_path) if log_path is not None else None
        self._log_file: IO[str] | None = None
        self.port = 0
        self.origins: dict[str, str] = {}
        """label -> "http://127.0.0.N:PORT"."""
        self.labels: dict[str, str] = {}
        """origin -> label."""
        self.addresses: dict[str, tuple[str, int]] = {}
        """label -> (address, port)."""
        self._hits: list[Hit] = []
        self._lock = threading.Lock()
        self._inflight: dict[str, int] = dict.fromkeys(self.sites, 0)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.Server] = []
        self._conns: set[asyncio.Task[None]] = set()

    # ---- lifecycle

    def start(self) -> LocalWeb:
        """Bind every origin and serve them from a background thread; returns self."""
        if self._loop is not None:
            raise RuntimeError("LocalWeb already started")
        if self._log_path is not None:
            self._log_file = self._log_path.open("a", encoding="utf-8")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="localweb", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._bind_all(), loop).result(timeout=60)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Close every server and connection, and the event loop; idempotent."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if not loop.is_running():
            loop.close()
        with self._lock:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None

    def __enter__(self) -> LocalWeb:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def _bind_all(self) -> None:
        labels = list(self.sites)
        attempts = 20 if self._requested_port == 0 else 1
        for attempt in range(attempts):
            servers: list[asyncio.Server] = []
            port = self._requested_port
            try:
                for label, address in zip(labels, self._addresses, strict=True):
                    server = await asyncio.start_server(
                        functools.partial(self._serve_connection, label), address, port,
                        limit=_HEAD_LIMIT, backlog=256, reuse_address=True,
                    )
                    if port == 0:
                        port = server.sockets[0].getsockname()[1]
                    servers.append(server)
            except OSError as exc:
                for server in servers:
                    server.close()
                if exc.errno == errno.EADDRNOTAVAIL:
                    raise OSError(exc.errno, f"cannot bind a loopback address ({exc}); on macOS add aliases, "
                                  "e.g. `sudo ifconfig lo0 alias 127.0.0.2 up`") from exc
                if exc.errno == errno.EADDRINUSE and attempt + 1 < attempts:
                    continue
                raise
            self._servers = servers
            self.port = port
            for label, address in zip(labels, self._addresses, strict=True):
                origin = f"http://{address}" if port == 80 else f"http://{address}:{port}"
                self.origins[label] = origin
                self.labels[origin] = label
                self.addresses[label] = (address, port)
            return

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        tasks = list(self._conns)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- placeholders

    def _check_placeholders(self) -> None:
        """Fail early on a placeholder naming a label this web does not have."""
        for label, site in self.sites.items():
            pages = list(site.pages.items()) + ([("/robots.txt", site.robots)] if site.robots else [])
            for path, page in pages:
                blobs = [v.encode() for v in page.headers.values()] + ([] if page.encoding else [page.body])
                for blob in blobs:
                    for m in _PLACEHOLDER_RE.finditer(blob):
                        if m.group(2).decode() not in self.sites:
                            name = m.group(0).decode()
                            raise ValueError(f"{label}{path}: placeholder {name} names no site")

    def _substitute(self, data: bytes) -> bytes:
        def repl(m: re.Match[bytes]) -> bytes:
            kind, label, mod = m.group(1), m.group(2).decode(), m.group(3)
            if label not in self.addresses:
                return m.group(0)
            address, port = self.addresses[label]
            if kind == b"host":
                return f"{address}:{port}".encode() if port != 80 else address.encode()
            scheme = "HTTP" if mod == b"upper" else "http"
            explicit = port != 80 or mod == b"port"
            return f"{scheme}://{address}:{port}".encode() if explicit else f"{scheme}://{address}".encode()

        return _PLACEHOLDER_RE.sub(repl, data) if b"{{" in data else data

    def expand(self, text: str) -> str:
        """`text` with {{origin:x}}-style placeholders replaced by this web's origins."""
        return self._substitute(text.encode()).decode()

    def url(self, label: str, path: str = "/") -> str:
        """The absolute URL of `path` on the origin labelled `label`."""
        if not path.startswith("/"):
            raise ValueError("path must start with '/'")
        return self.origins[label] + path

    # ---- serving

    async def _serve_connection(
        self, label: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
        peer = writer.get_extra_info("peername")
        client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        try:
            keep_alive = True
            while keep_alive:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._idle_timeout_s)
                except asyncio.LimitOverrunError:
                    await self._bare_response(writer, 431)
                    return
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    return
                keep_alive = await self._handle(label, client, head, reader, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the web is stopping: this task ends quietly either way
        except Exception:
            _log.exception("localweb: %s failed a request", label)
            await self._bare_response(writer, 500)
        finally:
            if task is not None:
                self._conns.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _bare_response(self, writer: asyncio.StreamWriter, status: int) -> None:
        """An error answer to something that was never a well-formed request (not logged as a Hit)."""
        reason = HTTPStatus(status).phrase
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    async def _handle(
        self, label: str, client: str, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Serve one request; True if the connection may carry another."""
        lines = head[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._bare_response(writer, 400)
            return False
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                await self._bare_response(writer, 400)
                return False
            headers[name.lower()] = value.strip()
        if "transfer-encoding" in headers:
            await self._bare_response(writer, 501)
            return False
        length = headers.get("content-length", "0")
        if not length.isdigit() or int(length) > _BODY_LIMIT:
            await self._bare_response(writer, 413 if length.isdigit() else 400)
            return False
        if int(length):
            await reader.readexactly(int(length))
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        keep_alive = "close" not in tokens if version == "HTTP/1.1" else "keep-alive" in tokens
        if target.startswith(("http://", "https://")):
            target = "/" + target.split("://", 1)[1].partition("/")[2]

        origin = self.origins[label]
        start = time.time()
        self._inflight[label] += 1
        concurrent = self._inflight[label]
        status, sent, complete, resource = 400, 0, False, target
        try:
            if not target.startswith("/"):
                page = Page(status=400, body=b"bad request target\n", content_type=TEXT)
            elif method not in ("GET", "HEAD"):
                page = Page(status=405, body=b"method not allowed\n", content_type=TEXT,
                            headers={"Allow": "GET, HEAD"})
                resource = canonical_target(target)
            else:
                page, resource = self._resolve(label, target)
            status = page.status
            if page.delay_s > 0:
                await asyncio.sleep(page.delay_s)
            body = page.body if page.encoding else self._substitute(page.body)
            writer.write(self._head(page, body, keep_alive))
            if method == "HEAD" or status in (204, 304) or status < 200:
                body = b""
            if page.trickle_s > 0 and body:
                await writer.drain()
                for i in range(len(body)):
                    await asyncio.sleep(page.trickle_s)
                    if writer.transport.is_closing():
                        raise ConnectionResetError("client went away")
                    writer.write(body[i : i + 1])
                    await writer.drain()
                    sent += 1
            else:
                writer.write(body)
                await writer.drain()
                sent = len(body)
            complete = True
        except Exception as exc:
            if not isinstance(exc, ConnectionError):
                status = 500
            raise
        finally:
            self._inflight[label] -= 1
            self._record(Hit(
                origin=origin, path=target, method=method, start=start, end=time.time(), status=status,
                user_agent=headers.get("user-agent", ""), concurrent=concurrent, label=label,
                resource=resource, client=client, bytes_sent=sent, complete=complete,
            ))
        return keep_alive

    def _head(self, page: Page, body: bytes, keep_alive: bool) -> bytes:
        try:
            reason = HTTPStatus(page.status).phrase
        except ValueError:
            reason = "Unknown"
        fields: dict[str, tuple[str, str]] = {}

        def put(name: str, value: str) -> None:
            fields[name.lower()] = (name, value)

        put("Date", formatdate(usegmt=True))
        put("Server", "hostring-localweb")
        if page.status not in (204, 304):
            if page.content_type:
                put("Content-Type", page.content_type)
            put("Content-Length", str(len(body)))
        if page.encoding:
            put("Content-Encoding", page.encoding)
        put("Connection", "keep-alive" if keep_alive else "close")
        for name, value in page.headers.items():
            put(name, self._substitute(value.encode()).decode())
        lines = [f"HTTP/1.1 {page.status} {reason}"] + [f"{n}: {v}" for n, v in fields.values()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _resolve(self, label: str, target: str) -> tuple[Page, str]:
        """The page a request target names and its resource identity."""
        site = self.sites[label]
        target = target.split("#", 1)[0]
        canon = canonical_target(target)
        if canon == "/robots.txt":
            return (site.robots or _not_found()), canon
        if target in site.pages:
            return site.pages[target], target
        if canon in site.pages:
            return site.pages[canon], canon
        for key, page in list(site.pages.items()):
            if canonical_target(key) == canon:
                return page, key
        if site.trap is not None:
            trap = _trap_page(site.trap, canon)
            if trap is not None:
                return trap, canon
        return _not_found(), canon

    def _record(self, hit: Hit) -> None:
        with self._lock:
            self._hits.append(hit)
            if self._log_file is not None:
                self._log_file.write(json.dumps(_hit_json(hit)) + "\n")
                self._log_file.flush()

    # ---- the log, as a judge reads it

    @property
    def hits(self) -> list[Hit]:
        """A snapshot of every request served so far, in completion order.

        A client may read a response a moment before the server coroutine logs it, so the snapshot first
        lets the event loop run its ready callbacks: a response the caller has seen is in the snapshot.
        """
        loop = self._loop
        if loop is not None and threading.current_thread() is not self._thread:
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                asyncio.run_coroutine_threadsafe(_settle(), loop).result(timeout=2)
        with self._lock:
            return list(self._hits)

    def _origin_of(self, origin_or_label: str) -> str:
        return self.origins.get(origin_or_label, origin_or_label)

    def hits_for(self, origin: str) -> list[Hit]:
        """Requests to one origin (origin URL or label), ordered by start time."""
        o = self._origin_of(origin)
        return sorted((h for h in self.hits if h.origin == o), key=lambda h: h.start)

    def max_concurrency(self, origin: str) -> int:
        """The most requests ever in flight at once on `origin` (0 if never contacted)."""
        return max((h.concurrent for h in self.hits_for(origin)), default=0)

    def min_gap(self, origin: str, *, between: Literal["end_start", "starts"] = "end_start") -> float:
        """Smallest pause on `origin`: from the latest earlier end to a start (negative if overlapping), or
        between consecutive starts; inf with fewer than two requests."""
        hits = self.hits_for(origin)
        gap = math.inf
        latest_end = -math.inf
        for prev, cur in itertools.pairwise(hits):
            latest_end = max(latest_end, prev.end)
            gap = min(gap, cur.start - (latest_end if between == "end_start" else prev.start))
        return gap

    def fetch_counts(self) -> Counter[tuple[str, str]]:
        """How often each (origin, resource) was requested, whatever spelling was used."""
        return Counter((h.origin, h.resource) for h in self.hits)

    def duplicates(self, *, include_robots: bool = False) -> list[tuple[str, str, int]]:
        """(origin, resource, count) for every resource requested more than once."""
        return sorted((o, r, n) for (o, r), n in self.fetch_counts().items()
                      if n > 1 and (include_robots or r != "/robots.txt"))

    def fetched(self) -> set[Key]:
        """Every (label, resource) requested at least once, robots files included."""
        return {(h.label, h.resource) for h in self.hits}

    def write_log(self, path: str | Path) -> None:
        """Write every Hit as one JSON object per line (what an outside judge reads)."""
        with Path(path).open("w", encoding="utf-8") as f:
            for hit in sorted(self.hits, key=lambda h: h.start):
                f.write(json.dumps(_hit_json(hit)) + "\n")


async def _settle() -> None:
    """Yield to the event loop a few times so that responses already written are logged."""
    for _ in range(3):
        await asyncio.sleep(0)


def _under(prefix: str | None, path: str) -> bool:
    """Whether `path` lies under the trap `prefix`."""
    if prefix is None:
        return False
    base = prefix.rstrip("/")
    return path == base or path.startswith(base + "/")


def _not_found() -> Page:
    return Page(status=404, body=b"<!DOCTYPE html><title>Not found</title><h1>Not found</h1>\n")


def _hit_json(hit: Hit) -> dict[str, object]:
    d: dict[str, object] = {"ts": datetime.fromtimestamp(hit.start, UTC).isoformat(timespec="microseconds")}
    d.update(asdict(hit))
    d["duration"] = round(hit.end - hit.start, 6)
    return d


# ----------------------------------------------------------------------------------------------------
# Robots rules, evaluated independently of hostring (RFC 9309)


def _robots_rules(text: str, user_agent: str) -> list[tuple[bool, str]]:
    """(allow, pattern) rules of the groups for `user_agent`: its own groups, else '*', else none."""
    token = user_agent.split("/", 1)[0].strip().lower()
    groups: list[tuple[list[str], list[tuple[bool, str]]]] = []
    in_agents = False
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "user-agent":
            if not in_agents:
                groups.append(([], []))
                in_agents = True
            groups[-1][0].append(value.lower())
        elif key in ("allow", "disallow"):
            in_agents = False
            if groups:
                groups[-1][1].append((key == "allow", value))
        else:
            in_agents = False if key != "sitemap" else in_agents
    own = [rules for agents, rules in groups if token in agents]
    chosen = own or [rules for agents, rules in groups if "*" in agents]
    return [rule for rules in chosen for rule in rules]


def _rule_matches(pattern: str, path: str) -> bool:
    anchored = pattern.endswith("$")
    body = pattern[:-1] if anchored else pattern
    regex = ".*".join(re.escape(part) for part in body.split("*"))
    return re.match(regex + ("$" if anchored else ""), path) is not None


def robots_allowed(text: str, user_agent: str, path: str) -> bool:
    """Whether robots `text` lets `user_agent` fetch `path`+query: longest match wins, Allow wins ties."""
    if canonical_target(path) == "/robots.txt":
        return True
    target = _pct_normalize(path)
    best: tuple[int, bool] | None = None
    for allow, pattern in _robots_rules(text, user_agent):
        if not pattern:
            continue
        pat = _pct_normalize(pattern)
        if _rule_matches(pat, target):
            cand = (len(pat), allow)
            if best is None or cand > best:
                best = cand
    return best is None or best[1]


# ----------------------------------------------------------------------------------------------------
# The model a generated web is rendered from, and its oracle


@dataclass
class LinkSpec:
    """A link to `target`; `href` fixes its spelling (placeholders allowed), else the renderer picks one."""

    target: Key
    nofollow: bool = False
    href: str | None = None


@dataclass
class PageSpec:
    """A page of the model: content page, redirect, or mirror (identical body) of another page."""

    links: list[LinkSpec] = field(default_factory=list)
    redirect_to: Key | None = None
    redirect_status: int = 301
    meta_nofollow: bool = False
    mirror_of: Key | None = None
    base: str | None = None
    """Directory path written as <base href> (same origin); relative links then resolve against it."""
    title: str = ""
    status: int = 200


@dataclass
class RobotsSpec:
    """An origin's robots: `file` (text), `missing` (404), `unavailable` (503), or `redirect` to a file
    elsewhere whose text applies to this origin (RFC 9309)."""

    kind: Literal["file", "missing", "unavailable", "redirect"] = "missing"
    text: str = ""
    redirect_to: Key | None = None


@dataclass
class WebModel:
    """A whole web by identity: what the oracle walks and the renderer turns into Sites."""

    origins: list[str]
    pages: dict[Key, PageSpec]
    robots: dict[str, RobotsSpec] = field(default_factory=dict)
    seeds: list[Key] = field(default_factory=list)
    traps: dict[str, str] = field(default_factory=dict)
    user_agent: str = "hostring"

    def in_trap(self, key: Key) -> bool:
        """Whether `key` lies under its origin's trap prefix."""
        return _under(self.traps.get(key[0]), key[1])

    def allowed(self, key: Key) -> bool:
        """Whether robots let the model's user agent fetch `key`."""
        spec = self.robots.get(key[0], RobotsSpec())
        if spec.kind == "missing":
            return True
        if spec.kind == "unavailable":
            return False
        return robots_allowed(spec.text, self.user_agent, key[1])


@dataclass
class Oracle:
    """What a correct crawler fetches from `seeds`, computed by BFS over the model's identities."""

    seeds: list[Key]
    reachable_allowed: set[Key]
    """Pages a correct crawler fetches (broken links included; robots files and trap pages excluded)."""
    disallowed: set[Key]
    """Every page of the model robots forbid (all pages of origins whose robots answer 503)."""
    blocked: set[Key]
    """Targets a correct crawler discovers through followable links but must not fetch because of robots."""
    broken: set[Key]
    """Reachable targets that 404."""
    trap_entries: set[Key]
    """Allowed trap pages linked from reachable pages: the crawler enters the trap there; budgets end it."""
    traps: dict[str, str]
    robots_missing: set[str]
    robots_unavailable: set[str]
    robots_redirects: dict[str, Key]
    robots_fetches: set[Key]
    """Robots files a correct crawler requests: /robots.txt of each contacted origin, redirect targets."""
    pages: set[Key]
    user_agent: str

    def seed_urls(self, web: LocalWeb) -> list[str]:
        """The seeds as real URLs of a running web."""
        return [web.url(label, path) for label, path in self.seeds]

    def urls(self, web: LocalWeb, keys: set[Key] | None = None) -> set[str]:
        """`keys` (default: reachable_allowed) as real URLs of a running web."""
        return {web.url(label, path) for label, path in (self.reachable_allowed if keys is None else keys)}

    def in_trap(self, key: Key) -> bool:
        """Whether `key` lies under its origin's trap prefix."""
        return _under(self.traps.get(key[0]), key[1])

    def judge(self, fetched: set[Key]) -> dict[str, set[Key]]:
        """Compare the (label, resource) pairs a crawler fetched with the oracle."""
        pages = {k for k in fetched if k not in self.robots_fetches and k[1] != "/robots.txt"}
        return {
            "missing": self.reachable_allowed - pages,
            "forbidden": pages & (self.disallowed | self.blocked),
            "unexpected": {k for k in pages - self.reachable_allowed if not self.in_trap(k)},
            "trap": {k for k in pages if self.in_trap(k)},
        }


def oracle_for(model: WebModel) -> Oracle:
    """Brute-force BFS over the model: robots, nofollow, meta nofollow, redirects, mirrors, traps."""
    seen: set[Key] = set(model.seeds)
    queue: deque[Key] = deque(model.seeds)
    reachable: set[Key] = set()
    blocked: set[Key] = set()
    broken: set[Key] = set()
    trap_entries: set[Key] = set()
    contacted: set[str] = set()

    def push(key: Key) -> None:
        if key not in seen:
            seen.add(key)
            queue.append(key)

    while queue:
        key = queue.popleft()
        contacted.add(key[0])
        if not model.allowed(key):
            blocked.add(key)
            continue
        if model.in_trap(key):
            trap_entries.add(key)
            continue
        reachable.add(key)
        spec = model.pages.get(key)
        if spec is None:
            broken.add(key)
            continue
        if spec.redirect_to is not None:
            push(spec.redirect_to)
            continue
        source = model.pages[spec.mirror_of] if spec.mirror_of is not None else spec
        if spec.status != 200 or source.meta_nofollow:
            continue
        for link in source.links:
            if not link.nofollow:
                push(link.target)

    def kind(label: str) -> str:
        return model.robots.get(label, RobotsSpec()).kind

    robots_fetches = {(label, "/robots.txt") for label in contacted}
    redirects = {label: r.redirect_to for label, r in model.robots.items()
                 if r.kind == "redirect" and r.redirect_to is not None}
    robots_fetches |= {target for label, target in redirects.items() if label in contacted}
    return Oracle(
        seeds=list(model.seeds),
        reachable_allowed=reachable,
        disallowed={k for k in model.pages if not model.allowed(k)},
        blocked=blocked,
        broken=broken,
        trap_entries=trap_entries,
        traps=dict(model.traps),
        robots_missing={o for o in model.origins if kind(o) == "missing"},
        robots_unavailable={o for o in model.origins if kind(o) == "unavailable"},
        robots_redirects=redirects,
        robots_fetches=robots_fetches,
        pages=set(model.pages),
        user_agent=model.user_agent,
    )


# ----------------------------------------------------------------------------------------------------
# Rendering a model into Sites


_WORDS = (
    "harbor", "lantern", "ferry", "market", "council", "river", "bridge", "garden", "library", "tower",
    "meadow", "orchard", "village", "quay", "station", "bakery", "chapel", "mill", "forge", "lighthouse",
    "dune", "cliff", "tide", "current", "anchor", "sail", "rope", "knot", "compass", "chart", "storm",
    "breeze", "fog", "rain", "sunrise", "dusk", "winter", "spring", "summer", "autumn", "morning",
    "evening", "ledger", "notice", "schedule", "report", "review", "guide", "manual", "index", "archive",
    "record", "letter", "journal", "diary", "recipe", "story", "poem", "song", "map", "route", "trail",
    "path", "street", "square", "alley", "lane", "road", "market", "fair", "festival", "concert", "parade",
    "lecture", "meeting", "vote", "budget", "plan", "project", "repair", "timber", "stone", "brick",
    "copper", "iron", "glass", "paper", "wool", "linen", "salt", "pepper", "honey", "apple", "pear",
    "plum", "cherry", "barley", "wheat", "oat", "bread", "cheese", "butter", "fish", "oyster", "crab",
    "gull", "heron", "otter", "fox", "badger", "owl", "swift", "sparrow", "wren", "oak", "ash", "elm",
    "willow", "birch", "pine", "fern", "moss", "heather", "thistle", "clover", "daisy", "poppy", "rose",
    "quiet", "busy", "early", "late", "small", "large", "narrow", "wide", "old", "new", "bright", "dark",
    "warm", "cold", "calm", "rough", "steady", "sudden", "careful", "simple", "honest", "patient",
    "curious", "gentle", "proud", "sturdy", "tired", "cheerful", "stubborn", "clever", "plain", "modest",
    "walk", "sail", "mend", "build", "paint", "carry", "gather", "measure", "weigh", "count", "write",
    "read", "teach", "learn", "sing", "cook", "bake", "plant", "harvest", "fish", "trade", "travel",
    "return", "visit", "open", "close", "begin", "finish", "repair", "borrow", "lend", "share", "welcome",
    "the", "a", "of", "and", "to", "in", "on", "at", "by", "for", "with", "from", "near", "under", "over",
    "after", "before", "during", "because", "while", "although", "neighbors", "visitors", "keepers",
    "farmers", "sailors", "teachers", "students", "children", "elders", "volunteers", "merchants",
    "carpenters", "painters", "writers", "readers", "cooks", "pilots", "wardens", "clerks", "builders",
    "fishermen", "gardeners", "weavers",
)


_SYLLABLES = ("ka", "lo", "mi", "ren", "sa", "tor", "vel", "un", "dra", "pe", "qui", "zo", "ban", "el", "fi",
              "gu", "ho", "ix", "ja", "lum", "mar", "nor", "os", "pri", "ris", "sto", "tri", "ves", "wen", "yor")


def _name(rng: random.Random) -> str:
    """A made-up proper name (a person, a boat, a place): tokens that make every page's text its own."""
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def _paragraph(rng: random.Random, n: int) -> str:
    """n words of plain text in sentences; different pages get different bags of words, so no two pages
    are near-duplicates under simhash (mirrors excepted)."""
    out: list[str] = []
    while len(out) < n:
        sentence = [_name(rng) if rng.random() < 0.2 else rng.choice(_WORDS) for _ in range(rng.randint(6, 14))]
        out.extend([sentence[0].capitalize(), *sentence[1:-1], sentence[-1] + "."])
    return " ".join(out)


def _split(path: str) -> tuple[list[str], str, str]:
    """(directory segments, last segment, query) of an absolute path."""
    p, _, q = path.partition("?")
    segs = p.split("/")[1:]
    return segs[:-1], segs[-1], q


def _dir_of(path: str) -> str:
    p = path.partition("?")[0]
    return p[: p.rfind("/") + 1]


def _pct_variant(rng: random.Random, segment: str) -> str:
    """The segment with one unreserved character percent-encoded, or its escapes in lower-case hex."""
    if "%" in segment and rng.random() < 0.5:
        return _PCT_RE.sub(lambda m: "%" + m.group(1).lower(), segment)
    spots = [i for i, ch in enumerate(segment) if ch in UNRESERVED and not _inside_escape(segment, i)]
    if not spots:
        return segment
    i = next((j for j in spots if segment[j] in "~-_"), None) if rng.random() < 0.6 else None
    i = rng.choice(spots) if i is None else i
    esc = f"%{ord(segment[i]):02X}"
    return segment[:i] + (esc.lower() if rng.random() < 0.3 else esc) + segment[i + 1 :]


def _inside_escape(s: str, i: int) -> bool:
    return (i >= 1 and s[i - 1] == "%") or (i >= 2 and s[i - 2] == "%")


def _spell(rng: random.Random, src: Key, base_dir: str, target: Key, *, relative_ok: bool) -> str:
    """One spelling of a link from page `src` to `target` that a correct crawler resolves back to `target`."""
    label, tpath = target
    same = label == src[0]
    forms = ["absolute", "absolute", "upper", "port", "netpath"]
    if same:
        forms += ["rootrel", "rootrel", "dotseg"]
        if relative_ok:
            forms += ["relative", "relative", "relative", "dot", "dotdot"]
    form = rng.choice(forms)
    tdirs, tfile, query = _split(tpath)
    pct = rng.random() < 0.2

    def emit(segs: list[str]) -> str:
        segs = list(segs)
        if pct:
            candidates = [i for i, s in enumerate(segs) if s]
            if candidates:
                i = rng.choice(candidates)
                segs[i] = _pct_variant(rng, segs[i])
        return "/".join(segs)

    if form in ("relative", "dot", "dotdot"):
        bsegs = base_dir.split("/")[1:-1]
        common = 0
        while common < min(len(bsegs), len(tdirs)) and bsegs[common] == tdirs[common]:
            common += 1
        up = len(bsegs) - common
        rest = emit([*tdirs[common:], tfile])
        if form == "dotdot":
            # Up one level and back down (at the root, RFC 3986 drops the excess "..").
            href = "../" + (bsegs[-1] + "/" if bsegs else "") + "../" * up + rest
        else:
            href = "../" * up + rest
            if not href or ":" in href.split("/", 1)[0] or (form == "dot" and not href.startswith(".")):
                href = "./" + href
    else:
        segs = ["", *tdirs, tfile]
        path = emit(segs)
        if form == "dotseg" and len(segs) > 2:
            i = rng.randint(1, len(segs) - 2)
            path = "/".join(segs[: i + 1]) + rng.choice(["/./", "/zz/../"]) + "/".join(segs[i + 1 :])
        host = {
            "absolute": f"{{{{origin:{label}}}}}",
            "upper": f"{{{{origin:{label}|upper}}}}",
            "port": f"{{{{origin:{label}|port}}}}",
            "netpath": f"//{{{{host:{label}}}}}",
        }.get(form, "")
        href = host + path
    if rng.random() < 0.15:
        tracking = rng.choice(["utm_source=news", "utm_source=rss&utm_medium=feed", "utm_campaign=spring"])
        parts = [tracking, query] if rng.random() < 0.5 else [query, tracking]
        query = "&".join(part for part in parts if part)
    if query:
        href += "?" + query
    if rng.random() < 0.15:
        href += "#" + rng.choice(["top", "sec-2", "comments", "Details"])
    return href


def render_model(model: WebModel, seed: int = 0) -> dict[str, Site]:
    """Sites serving `model`: HTML pages with varied link spellings, robots files, redirects, traps."""
    rng = random.Random(seed)
    sites: dict[str, Site] = {label: Site(trap=model.traps.get(label)) for label in model.origins}
    mirrored = {spec.mirror_of for spec in model.pages.values() if spec.mirror_of is not None}
    ordered = sorted(model.pages.items(), key=lambda kv: kv[1].mirror_of is not None)
    for key, spec in ordered:
        label, path = key
        if spec.redirect_to is not None:
            t_label, t_path = spec.redirect_to
            loc = t_path if t_label == label and rng.random() < 0.4 else f"{{{{origin:{t_label}}}}}{t_path}"
            sites[label].pages[path] = redirect_page(loc, spec.redirect_status)
        elif spec.mirror_of is not None:
            original = sites[spec.mirror_of[0]].pages[spec.mirror_of[1]]
            sites[label].pages[path] = Page(status=spec.status, body=original.body)
        else:
            sites[label].pages[path] = Page(
                status=spec.status, body=_render_html(rng, model, key, spec, relative_ok=key not in mirrored))
    for label, robots in model.robots.items():
        if robots.kind == "file":
            sites[label].robots = robots_page(robots.text)
        elif robots.kind == "unavailable":
            sites[label].robots = Page(status=503, body=b"busy\n", content_type=TEXT,
                                       headers={"Retry-After": "60"})
        elif robots.kind == "redirect" and robots.redirect_to is not None:
            t_label, t_path = robots.redirect_to
            sites[label].robots = redirect_page(f"{{{{origin:{t_label}}}}}{t_path}")
            sites[t_label].pages[t_path] = robots_page(robots.text)
    return sites


def _render_html(
    rng: random.Random, model: WebModel, key: Key, spec: PageSpec, *, relative_ok: bool
) -> bytes:
    label, path = key
    title = spec.title or f"{label} {path}"
    head = [f"<title>{html.escape(title)}</title>"]
    if spec.meta_nofollow:
        content = rng.choice(["nofollow", "noindex, nofollow", "NOFOLLOW", "noarchive,nofollow"])
        head.append(f'<meta name="{rng.choice(["robots", "ROBOTS"])}" content="{content}">')
    base_dir = _dir_of(path)
    if spec.base is not None:
        base_dir = spec.base
        href = spec.base if rng.random() < 0.5 else f"{{{{origin:{label}}}}}{spec.base}"
        head.append(f'<base href="{html.escape(href)}">')
    items = []
    for link in spec.links:
        href = link.href if link.href is not None else _spell(rng, key, base_dir, link.target,
                                                             relative_ok=relative_ok)
        rel = ""
        if link.nofollow:
            rel = f' rel="{rng.choice(["nofollow", "ugc nofollow", "NoFollow", "nofollow noopener"])}"'
        anchor = model.pages[link.target].title if link.target in model.pages else ""
        anchor = anchor or link.target[1].strip("/").replace("/", " ") or "home"
        items.append(f'<li><a href="{html.escape(href)}"{rel}>{html.escape(anchor)}</a></li>')
    text_rng = random.Random(zlib.crc32(f"{label}|{path}".encode()))
    doc = "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        '<head>\n<meta charset="utf-8">',
        *head,
        "</head>",
        "<body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{_paragraph(text_rng, 60)}</p>",
        '<ul class="links">',
        *items,
        "</ul>",
        f"<p>{_paragraph(text_rng, 60)}</p>",
        "</body>",
        "</html>",
        "",
    ])
    return doc.encode("utf-8")


# ----------------------------------------------------------------------------------------------------
# Random webs


_SECTIONS = ("docs", "blog", "news", "shop", "about", "~alice", "help", "archive", "tags", "wiki", "team",
             "private", "events-old", "lists")
_SLUGS = ("intro", "setup", "getting-started", "faq", "release_notes", "road-map", "spring", "sprint",
          "print", "printable", "history", "contact", "pricing", "winter-sale", "tide_tables", "c%2B%2B",
          "a%20b", "drafts", "notes", "v1.2", "old.page", "hello-world", "team_photo", "index.html")


def _random_paths(rng: random.Random, n: int) -> list[str]:
    """n distinct normal-form paths, "/" first: sections, nested pages, query pages, trailing-slash twins."""
    sections = rng.sample(_SECTIONS, k=min(len(_SECTIONS), rng.randint(3, 5)))
    paths = ["/"]
    seen = {"/"}
    attempts = 0
    while len(paths) < n and attempts < n * 50:
        attempts += 1
        sec, slug = rng.choice(sections), rng.choice(_SLUGS)
        r = rng.random()
        if r < 0.15:
            cand = f"/{sec}/"
        elif r < 0.2:
            cand = f"/{sec}"
        elif r < 0.55:
            cand = f"/{sec}/{slug}"
        elif r < 0.75:
            cand = f"/{sec}/{rng.choice(_SLUGS)}/{slug}"
        elif r < 0.85:
            cand = f"/{sec}?{rng.choice(['page', 'sort', 'q'])}={rng.choice(['1', '2', 'asc', 'x-y'])}"
        else:
            cand = f"/{slug}"
        if cand not in seen and "/." not in cand:
            seen.add(cand)
            paths.append(cand)
    while len(paths) < n:
        paths.append(f"/extra/page-{len(paths)}")
    return paths


def _robots_text(rng: random.Random, paths: list[str], user_agent: str) -> str:
    """A robots file for these paths with the subtleties: longest match, Allow overrides and ties, wildcards,
    `$`, prefixes cutting a segment, percent-encoding, and a group for another bot that must not apply."""
    rules: list[tuple[str, str]] = []
    dirs: dict[str, list[str]] = {}
    for p in paths:
        if p.count("/") >= 2:
            dirs.setdefault("/" + p.split("/")[1] + "/", []).append(p)
    crowded = sorted(d for d, ps in dirs.items() if len(ps) >= 2)
    if crowded:
        section = rng.choice(crowded)
        spelled = section.replace("~", "%7E") if rng.random() < 0.5 else section
        rules.append(("Disallow", spelled))
        inner = sorted(p for p in dirs[section] if p != section and not _index_file(p))
        if inner:
            rules.append(("Allow", rng.choice(inner)))
    leaves = sorted(p for p in paths if "?" not in p and "%" not in p and len(p.rsplit("/", 1)[-1]) > 3)
    if leaves:
        leaf = rng.choice(leaves)
        rules.append(("Disallow", leaf[: len(leaf) - rng.randint(1, 2)]))
    if any("sort=" in p for p in paths):
        rules.append(("Disallow", "/*?sort="))
    if any(p.endswith("/print") for p in paths):
        rules.append(("Disallow", "/*/print$"))
    plain_leaves = [p for p in leaves if not _index_file(p)]
    if plain_leaves and rng.random() < 0.5:
        tie = rng.choice(plain_leaves)
        rules += [("Disallow", tie), ("Allow", tie)]
    rng.shuffle(rules)
    body = "\n".join(f"{k}: {v}" for k, v in rules)
    other = "User-agent: otherbot\nCrawl-delay: 10\nDisallow: /\n"
    if rng.random() < 0.5:
        token = "".join(c.upper() if rng.random() < 0.3 else c for c in user_agent)
        return f"# robots.txt\nUser-agent: *\nDisallow: /\n\n{other}\nUser-agent: {token}\n{body}\n"
    return f"# robots.txt\n{other}\nUser-agent: *\n{body}\n"


def _index_file(path: str) -> bool:
    """Google's matcher (and protego) let `Allow: /d/index.html` also allow `/d/`; RFC 9309 does not, so
    generated Allow rules never name an index file and both readings agree."""
    return path.partition("?")[0].endswith(("/index.html", "/index.htm"))


def random_model(
    seed: int,
    *,
    origins: int = 6,
    pages_per_origin: int = 20,
    links_per_page: int = 8,
    robots_fraction: float = 0.5,
    unavailable_robots: int | None = None,
    redirect_robots_fraction: float = 0.3,
    cross_fraction: float = 0.2,
    nofollow_fraction: float = 0.08,
    meta_nofollow_fraction: float = 0.05,
    redirect_fraction: float = 0.05,
    mirror_fraction: float = 0.05,
    broken_fraction: float = 0.03,
    base_fraction: float = 0.1,
    trap_fraction: float = 0.2,
    seeds: int = 1,
    user_agent: str = "hostring",
) -> WebModel:
    """A deterministic random web model; `unavailable_robots` defaults to 1 origin (robots 503) if >= 3."""
    rng = random.Random(seed)
    labels = [f"site{i}" for i in range(origins)]
    paths = {label: _random_paths(rng, pages_per_origin) for label in labels}
    pages: dict[Key, PageSpec] = {(lb, p): PageSpec() for lb in labels for p in paths[lb]}
    traps = {lb: "/calendar" for lb in labels if rng.random() < trap_fraction}

    for label in labels:
        for i, path in enumerate(paths[label]):
            if i == 0:
                continue
            spec = pages[(label, path)]
            r = rng.random()
            if r < redirect_fraction:
                t_label = rng.choice(labels) if rng.random() < 0.5 else label
                spec.redirect_to = (t_label, rng.choice(paths[t_label]))
                spec.redirect_status = rng.choice([301, 302, 307, 308])
            elif r < redirect_fraction + mirror_fraction:
                cands = [p for p in paths[label][:i] if pages[(label, p)].redirect_to is None
                         and pages[(label, p)].mirror_of is None]
                if cands:
                    spec.mirror_of = (label, rng.choice(cands))
            elif r < redirect_fraction + mirror_fraction + meta_nofollow_fraction:
                spec.meta_nofollow = True

    def content(key: Key) -> bool:
        return pages[key].redirect_to is None and pages[key].mirror_of is None

    for label in labels:
        # A spanning tree first, so most pages are reachable unless robots or nofollow say otherwise.
        for j, path in enumerate(paths[label][1:], start=1):
            parent = rng.choice([p for p in paths[label][:j] if content((label, p))])
            pages[(label, parent)].links.append(LinkSpec((label, path)))
        for path in paths[label]:
            key = (label, path)
            if not content(key):
                continue
            links = pages[key].links
            while len(links) < links_per_page:
                r = rng.random()
                if r < broken_fraction:
                    target = (label, f"/{rng.choice(_SECTIONS)}/missing-{rng.randint(1, 999)}")
                elif r < broken_fraction + cross_fraction and len(labels) > 1:
                    other = rng.choice([lb for lb in labels if lb != label])
                    target = (other, "/" if rng.random() < 0.3 else rng.choice(paths[other]))
                elif label in traps and r < broken_fraction + cross_fraction + 0.05:
                    target = (label, traps[label] + rng.choice(["", "/", "/2024/01"]))
                else:
                    target = (label, rng.choice(paths[label]))
                links.append(LinkSpec(target, nofollow=rng.random() < nofollow_fraction))
            rng.shuffle(links)
            pages[key].links = links
            if rng.random() < base_fraction:
                pages[key].base = rng.choice(sorted({_dir_of(p) for p in paths[label]}))

    robots: dict[str, RobotsSpec] = {}
    n_unavailable = (1 if origins >= 3 else 0) if unavailable_robots is None else unavailable_robots
    others = labels[1:]
    rng.shuffle(others)
    for label in others[:n_unavailable]:
        robots[label] = RobotsSpec("unavailable")
    for label in labels:
        if label in robots:
            continue
        if rng.random() >= robots_fraction:
            robots[label] = RobotsSpec("missing")
            continue
        text = _robots_text(rng, paths[label], user_agent)
        if len(labels) > 1 and rng.random() < redirect_robots_fraction:
            host = rng.choice([lb for lb in labels if lb != label])
            robots[label] = RobotsSpec("redirect", text, (host, f"/shared-robots/{label}.txt"))
        else:
            robots[label] = RobotsSpec("file", text)

    allowed_roots = [lb for lb in labels if robots[lb].kind != "unavailable"]
    seed_keys = [(lb, "/") for lb in allowed_roots[: max(1, seeds)]]
    return WebModel(origins=labels, pages=pages, robots=robots, seeds=seed_keys, traps=traps,
                    user_agent=user_agent)


def random_web(seed: int, **kwargs: Any) -> tuple[dict[str, Site], Oracle]:
    """Sites and their Oracle for a deterministic random web; keyword arguments go to `random_model`."""
    model = random_model(seed, **kwargs)
    return render_model(model, seed), oracle_for(model)


# ----------------------------------------------------------------------------------------------------
# The demo web


_SAMPLE: dict[str, list[tuple[str, str, list[str]]]] = {
    # label: [(path, title, links)]; a link is "path" (same origin) or "label:path"; "!" marks rel=nofollow.
    "news": [
        ("/", "Harbor Town News",
         ["/local/", "/sports/", "/about", "/drafts/", "docs:/", "blog:/", "!shop:/"]),
        ("/local/", "Local news", ["/local/ferry-schedule", "/local/market-day", "/local/council-vote"]),
        ("/local/ferry-schedule", "New ferry schedule", ["/local/", "docs:/latest/guide"]),
        ("/local/market-day", "Market day moves to Saturday", ["shop:/", "/local/council-vote"]),
        ("/local/council-vote", "Council votes on the sea wall", ["/local/", "/drafts/budget-leak"]),
        ("/sports/", "Sports", ["/sports/regatta-results", "/sports/youth-league"]),
        ("/sports/regatta-results", "Regatta results", ["/sports/", "blog:/2024/sailing-notes"]),
        ("/sports/youth-league", "Youth league opens", ["/sports/"]),
        ("/drafts/", "Drafts", ["/drafts/budget-leak"]),
        ("/drafts/budget-leak", "Unpublished: budget", ["/"]),
        ("/drafts/press-kit", "Press kit", ["/about"]),
        ("/about", "About the paper", ["/", "/drafts/press-kit"]),
    ],
    "docs": [
        ("/", "Lantern documentation",
         ["/latest/guide", "/v1/guide", "/latest/faq", "/latest/api/", "/legacy/", "news:/"]),
        ("/latest/guide", "User guide", ["/latest/faq", "/latest/api/", "/"]),
        ("/latest/faq", "Questions and answers", ["/latest/guide", "/latest/api/", "/~maintainers/"]),
        ("/latest/api/", "API reference", ["/latest/api/client", "/latest/api/server", "/print/faq"]),
        ("/latest/api/client", "Client API", ["/latest/api/"]),
        ("/latest/api/server", "Server API", ["/latest/api/", "/latest/api/client"]),
        ("/~maintainers/", "Maintainers", ["/"]),
        ("/legacy/", "Legacy documents", ["/legacy/old-spec"]),
        ("/legacy/old-spec", "Old specification", ["/"]),
    ],
    "shop": [
        ("/", "Chandlery shop", ["/catalog?page=1", "/catalog?page=2", "/catalog?sort=price", "/events",
                                 "/contact", "/cartography-maps"]),
        ("/catalog?page=1", "Catalog, page 1", ["/items/lantern", "/items/rope", "/catalog?page=2"]),
        ("/catalog?page=2", "Catalog, page 2", ["/items/compass", "/items/oilskin", "/catalog?page=1"]),
        ("/catalog?sort=price", "Catalog by price", ["/items/lantern"]),
        ("/items/lantern", "Storm lantern", ["/catalog?page=1", "/cart"]),
        ("/items/rope", "Manila rope", ["/catalog?page=1", "/cart"]),
        ("/items/compass", "Brass compass", ["/catalog?page=2", "/cart"]),
        ("/items/oilskin", "Oilskin coat", ["/catalog?page=2", "/cart"]),
        ("/cart", "Your cart", ["/"]),
        ("/cartography-maps", "Charts and maps", ["/"]),
        ("/contact", "Contact", ["/", "news:/local/market-day"]),
    ],
    "blog": [
        ("/", "A sailor's notebook", ["/2024/sailing-notes", "/2024/knots", "/old-home", "/about"]),
        ("/2024/sailing-notes", "Sailing notes", ["/", "/2024/knots", "news:/sports/regatta-results"]),
        ("/2024/knots", "Five knots worth knowing", ["/2024/sailing-notes", "!/2024/secret-draft"]),
        ("/2024/secret-draft", "Draft", ["/"]),
        ("/about", "About me", ["/"]),
    ],
}

_SAMPLE_ROBOTS = {
    "news": "# Harbor Town News\nUser-agent: *\nDisallow: /drafts/\nAllow: /drafts/press-kit\n\n"
            "User-agent: archive-bot\nCrawl-delay: 30\nDisallow: /sports/\n",
    "shop": "User-agent: *\nDisallow: /*?sort=\nDisallow: /cart\n",
}


def sample_model(user_agent: str = "hostring") -> WebModel:
    """The demo web: 4 origins, ~37 pages, robots rules, a cross-origin 301, a calendar trap, mirrors."""
    pages: dict[Key, PageSpec] = {}
    for label, rows in _SAMPLE.items():
        for path, title, links in rows:
            specs = []
            for ref in links:
                nofollow = ref.startswith("!")
                ref = ref.lstrip("!")
                t_label, _, t_path = ref.rpartition(":") if not ref.startswith("/") else ("", "", ref)
                specs.append(LinkSpec((t_label or label, t_path), nofollow=nofollow))
            pages[(label, path)] = PageSpec(links=specs, title=title)
    pages[("docs", "/v1/guide")] = PageSpec(mirror_of=("docs", "/latest/guide"), title="User guide")
    pages[("docs", "/print/faq")] = PageSpec(mirror_of=("docs", "/latest/faq"), title="Questions and answers")
    pages[("docs", "/legacy/")].meta_nofollow = True
    pages[("blog", "/old-home")] = PageSpec(redirect_to=("news", "/"), redirect_status=301)
    robots = {label: RobotsSpec("file", text) for label, text in _SAMPLE_ROBOTS.items()}
    robots.update({"docs": RobotsSpec("missing"), "blog": RobotsSpec("missing")})
    return WebModel(origins=list(_SAMPLE), pages=pages, robots=robots, seeds=[("news", "/")],
                    traps={"shop": "/events"}, user_agent=user_agent)


def sample_web() -> dict[str, Site]:
    """The Sites of the demo web (`hostring demo`)."""
    return render_model(sample_model(), seed=7)


def sample_oracle(user_agent: str = "hostring") -> Oracle:
    """What a correct crawler fetches from the demo web's seed."""
    return oracle_for(sample_model(user_agent))


# ----------------------------------------------------------------------------------------------------
# CLI


def _interrupt(signum: int, frame: object) -> None:
    """Turn SIGTERM into KeyboardInterrupt so the `with LocalWeb` block unwinds."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """python -m coordinator.localweb: serve a random (or the sample) web and print its origins."""
    ap = argparse.ArgumentParser(prog="python -m coordinator.localweb", description=main.__doc__)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--origins", type=int, default=6)
    ap.add_argument("--pages", type=int, default=20, help="pages per origin")
    ap.add_argument("--sample", action="store_true", help="serve the demo web instead of a random one")
    ap.add_argument("--port", type=int, default=0, help="shared port (0: pick a free one)")
    ap.add_argument("--log", type=Path, default=None, help="append every request as a JSON line")
    args = ap.parse_args(argv)
    # A background job may start with SIGINT ignored; Ctrl-C and SIGTERM both stop the web cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    if args.sample:
        sites, oracle = sample_web(), sample_oracle()
    else:
        sites, oracle = random_web(args.seed, origins=args.origins, pages_per_origin=args.pages)
    with contextlib.suppress(KeyboardInterrupt), LocalWeb(sites, port=args.port, log_path=args.log) as web:
        for label, origin in web.origins.items():
            print(f"{label}\t{origin}", flush=True)
        print("seeds:\t" + " ".join(oracle.seed_urls(web)), flush=True)
        print(f"a correct crawler fetches {len(oracle.reachable_allowed)} pages; Ctrl-C to stop", flush=True)
        while True:
            time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
