"""LocalWeb: a multi-origin web on loopback, and its request log (Hit) as a judge reads it.

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

Identity. The server maps a request target to the page it names the way real servers do
(``hostring_testing.identity.canonical_target``); each Hit records both the raw target (``path``) and the page it
resolved to (``resource``), so ``duplicates()`` catches a crawler that fetched one page under two spellings.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import ipaddress
import itertools
import json
import logging
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from email.utils import formatdate
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

from hostring_testing.identity import canonical_target
from hostring_testing.pages import TEXT, Key, Page, Site, not_found, trap_page

__all__ = ["CountingWeb", "Hit", "LocalWeb"]

_LABEL_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_PLACEHOLDER_RE = re.compile(rb"\{\{(origin|host):([A-Za-z0-9_.\-]+)(?:\|(upper|port))?\}\}")
_log = logging.getLogger(__name__)
_HEAD_LIMIT = 32 * 1024
_BODY_LIMIT = 1 << 20


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
    conditional: bool = False
    """The request carried If-None-Match or If-Modified-Since."""


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

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
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
                        functools.partial(self._serve_connection, label),
                        address,
                        port,
                        limit=_HEAD_LIMIT,
                        backlog=256,
                        reuse_address=True,
                    )
                    if port == 0:
                        port = server.sockets[0].getsockname()[1]
                    servers.append(server)
            except OSError as exc:
                for server in servers:
                    server.close()
                if exc.errno == errno.EADDRNOTAVAIL:
                    raise OSError(
                        exc.errno,
                        f"cannot bind a loopback address ({exc}); on macOS add aliases, "
                        "e.g. `sudo ifconfig lo0 alias 127.0.0.2 up`",
                    ) from exc
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

    async def _serve_connection(self, label: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
                page = Page(status=405, body=b"method not allowed\n", content_type=TEXT, headers={"Allow": "GET, HEAD"})
                resource = canonical_target(target)
            else:
                page, resource = self._resolve(label, target)
                page = page.at(start, headers)
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
            self._record(
                Hit(
                    origin=origin,
                    path=target,
                    method=method,
                    start=start,
                    end=time.time(),
                    status=status,
                    user_agent=headers.get("user-agent", ""),
                    concurrent=concurrent,
                    label=label,
                    resource=resource,
                    client=client,
                    bytes_sent=sent,
                    complete=complete,
                    conditional="if-none-match" in headers or "if-modified-since" in headers,
                )
            )
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
        """The page a request's target names and its resource identity, as the server answers it (a subclass may
        watch requests here)."""
        return self.page(label, target)

    def page(self, label: str, target: str) -> tuple[Page, str]:
        """The page a request target names on origin `label` and its resource identity (a 404 page for none)."""
        site = self.sites[label]
        target = target.split("#", 1)[0]
        canon = canonical_target(target)
        if canon == "/robots.txt":
            return (site.robots or not_found()), canon
        if target in site.pages:
            return site.pages[target], target
        if canon in site.pages:
            return site.pages[canon], canon
        for key, page in list(site.pages.items()):
            if canonical_target(key) == canon:
                return page, key
        if site.trap is not None:
            trap = trap_page(site.trap, canon)
            if trap is not None:
                return trap, canon
        return not_found(), canon

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
        return sorted(
            (o, r, n) for (o, r), n in self.fetch_counts().items() if n > 1 and (include_robots or r != "/robots.txt")
        )

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


def _hit_json(hit: Hit) -> dict[str, object]:
    d: dict[str, object] = {"ts": datetime.fromtimestamp(hit.start, UTC).isoformat(timespec="microseconds")}
    d.update(asdict(hit))
    d["duration"] = round(hit.end - hit.start, 6)
    return d


class CountingWeb(LocalWeb):
    """A LocalWeb that also counts accepted TCP connections per origin label and notes when requests begin.

    LocalWeb logs requests (Hits) only, when they end; a client that connects and sends nothing would leave no
    trace, so tests that must show "no connection at all" count accepts here. (It overrides two private
    LocalWeb methods, which is why it lives beside LocalWeb.)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connections: Counter[str] = Counter()
        self.started: list[tuple[str, str, float]] = []
        """(label, resource, time) of every request as it begins (Hits are logged when a request ends)."""

    async def _serve_connection(self, label: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections[label] += 1
        await super()._serve_connection(label, reader, writer)

    def _resolve(self, label: str, target: str) -> tuple[Page, str]:
        self.started.append((label, canonical_target(target), time.time()))
        return super()._resolve(label, target)

    def has_started(self, label: str, resource: str) -> bool:
        return any(lb == label and r == resource for lb, r, _ in list(self.started))
