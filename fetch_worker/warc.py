"""Rotating, per-record-gzipped WARC output written with warcio.

Every fetch becomes a `response` record (status line, headers, body) and a
`request` record pointing at it with WARC-Concurrent-To; a duplicate body
becomes an identical-payload-digest `revisit` record instead, and a 304 to a
conditional revisit a server-not-modified `revisit` record, each referring
(WARC-Refers-To) to the record that holds the stored body. Each file begins
with a `warcinfo` record and is rotated once it reaches `max_file_bytes`
(a request/response pair is never split across files).

Crash safety: each record group is serialized and gzipped in memory as its own
gzip member, then written with one unbuffered write. A killed process leaves
only complete members behind, so the file reads cleanly up to the last whole
record. Files are written as `NAME.warc.gz.open` and renamed to
`{prefix}-{UTC timestamp}-{serial:05d}.warc.gz` when complete (the Heritrix
convention), so anything that ships WARCs only ever picks finished files; a
leftover `.open` file after a crash is readable as it is.

The stored body is the *decoded* body (the fetcher removes Content-Encoding
and chunking), so HTTP headers that would misdescribe it are not stored as
they came: Content-Encoding and Transfer-Encoding, and a Content-Length that
differs from the stored body, are kept under the `X-Archive-Orig-` prefix
(the wayback/pywb convention) and a Content-Length of the stored body is
added. A body cut short by a limit, or not read because of its content type,
is marked with WARC-Truncated ("length", "time", "disconnect", "unspecified").
The payload digest is therefore the digest of the decoded body, which is also
what `payload_digest` computes for duplicate detection.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import socket
import threading
import zlib
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import httpx
from warcio.statusandheaders import StatusAndHeaders
from warcio.timeutils import datetime_to_iso_date
from warcio.warcwriter import WARCWriter

from fetch_worker.fetch import TRUNCATED_UNSPECIFIED, FetchResult

_ORIG = "X-Archive-Orig-"
SERVER_NOT_MODIFIED = "http://netpreserve.org/warc/1.0/revisit/server-not-modified"
_NOT_STORED_AS_IS = frozenset({"content-encoding", "transfer-encoding"})


def payload_digest(body: bytes) -> str:
    """The WARC-Payload-Digest of a stored body: 'sha1:' + base32, as warcio writes it."""
    return "sha1:" + base64.b32encode(hashlib.sha1(body).digest()).decode("ascii")


def finalize_open_files(out_dir: Path, prefix: str = "") -> list[Path]:
    """Finish the `.open` files a killed writer left in `out_dir` (of writers named `prefix`, if given).

    Each file is cut after its last whole gzip member (a record group is one member, written at once, so only
    an OS crash can leave a torn one) and renamed to its final name. Call it only where no writer is running
    with those names (a crawl's own WARC directory, before its worker starts). Returns the finished files.
    """
    done: list[Path] = []
    for partial in sorted(Path(out_dir).glob(f"{prefix}*.warc.gz.open")):
        whole = _whole_members(partial.read_bytes())
        with open(partial, "r+b") as f:
            f.truncate(whole)
        final = partial.with_name(partial.name.removesuffix(".open"))
        if final.exists():
            final = final.with_name(final.name.removesuffix(".warc.gz") + "-recovered.warc.gz")
        os.replace(partial, final)
        done.append(final)
    return done


def _whole_members(data: bytes) -> int:
    """The length of the leading run of complete gzip members in `data`."""
    end = 0
    while end < len(data):
        unpacker = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            unpacker.decompress(data[end:])
        except zlib.error:
            break
        if not unpacker.eof:
            break
        end = len(data) - len(unpacker.unused_data)
    return end


def warc_date(unix_time: float) -> str:
    """A WARC-Date value (UTC, ISO 8601) for a Unix time; now when it is not positive."""
    return _warc_date(unix_time)


def _warc_date(unix_time: float) -> str:
    when = datetime.fromtimestamp(unix_time, UTC) if unix_time > 0 else datetime.now(UTC)
    return str(datetime_to_iso_date(when.replace(tzinfo=None)))


def _stored_response_headers(result: FetchResult) -> StatusAndHeaders:
    """The response status line and headers as they describe the stored (decoded) body."""
    body_length = str(len(result.body))
    headers: list[tuple[str, str]] = []
    rewritten = length_ok = False
    for name, value in result.headers:
        lower = name.lower()
        if lower in _NOT_STORED_AS_IS or (lower == "content-length" and value.strip() != body_length):
            headers.append((_ORIG + name, value))
            rewritten = True
        else:
            headers.append((name, value))
            length_ok = length_ok or lower == "content-length"
    if rewritten and not length_ok:
        headers.append(("Content-Length", body_length))
    statusline = f"{result.status} {result.reason}".rstrip()
    return StatusAndHeaders(statusline, headers, protocol=result.http_version or "HTTP/1.1")


def _request_target(url: str) -> str:
    """The request-target as httpx sent it (percent-encoded path and query)."""
    try:
        return httpx.URL(url).raw_path.decode("ascii")
    except (httpx.InvalidURL, UnicodeDecodeError):
        parts = urlsplit(url)
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _request_headers(result: FetchResult) -> StatusAndHeaders:
    target = result.request_target or _request_target(result.url)
    version = result.http_version or "HTTP/1.1"
    return StatusAndHeaders(f"{result.method} {target} {version}", list(result.request_headers), protocol="")


class WarcWriter:
    """Writes fetch results into rotating `.warc.gz` files in `out_dir`.

    Give every worker its own `prefix` (e.g. "hostring-worker-3"); names also
    carry a millisecond timestamp and a serial, and files are created
    exclusively, so two writers never clobber each other. Thread-safe, so the
    lease loop may call it through `asyncio.to_thread` to keep gzip work off
    the event loop. `fsync=True` also survives an OS crash, at a cost per record.
    """

    def __init__(
        self,
        out_dir: Path,
        *,
        prefix: str = "hostring",
        max_file_bytes: int = 1_000_000_000,
        software: str = "hostring/0.1",
        info: Mapping[str, str] | None = None,
        compress_level: int = 6,
        fsync: bool = False,
    ) -> None:
        if max_file_bytes <= 0:
            raise ValueError("max_file_bytes must be positive")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        self.max_file_bytes = max_file_bytes
        self.software = software
        self.info = dict(info or {})
        self.compress_level = compress_level
        self.fsync = fsync
        self.files: list[Path] = []
        self._builder = WARCWriter(None, gzip=False)
        self._lock = threading.Lock()
        self._serial = 0
        self._file: io.FileIO | None = None
        self._path: Path | None = None
        self._size = 0
        self._closed = False

    # --- public API -------------------------------------------------------------------------------

    def write_fetch(self, result: FetchResult, digest: str = "") -> str:
        """Write request + response records for a fetch that got a response; return the response id. `digest`:
        the body's `payload_digest` when the caller has it already (else it is computed here)."""
        if not result.status:
            raise ValueError(f"no response to archive for {result.url} ({result.error_class})")
        warc_headers = self._common_warc_headers(result)
        if digest:
            warc_headers["WARC-Payload-Digest"] = digest
        truncated = result.truncated or (TRUNCATED_UNSPECIFIED if result.body_skipped else "")
        if truncated:
            warc_headers["WARC-Truncated"] = truncated
        response = self._builder.create_warc_record(
            result.url,
            "response",
            payload=io.BytesIO(result.body),
            length=len(result.body),
            warc_headers_dict=warc_headers,
            http_headers=_stored_response_headers(result),
        )
        return self._write_with_request(result, response)

    def write_revisit(
        self,
        result: FetchResult,
        refers_to: str,
        refers_to_uri: str,
        digest: str,
        refers_to_date: str = "",
    ) -> str:
        """Write request + identical-payload-digest revisit records; return the revisit id.

        `refers_to` is the WARC-Record-ID of the original response, `digest`
        its payload digest (see `payload_digest`); only HTTP headers are stored.
        """
        if not result.status:
            raise ValueError(f"no response to archive for {result.url} ({result.error_class})")
        warc_headers = self._common_warc_headers(result)
        warc_headers["WARC-Refers-To"] = refers_to
        revisit = self._builder.create_revisit_record(
            result.url,
            digest,
            refers_to_uri,
            refers_to_date,
            http_headers=_stored_response_headers(result),
            warc_headers_dict=warc_headers,
        )
        if not refers_to_date:
            revisit.rec_headers.remove_header("WARC-Refers-To-Date")
        return self._write_with_request(result, revisit)

    def write_not_modified(self, result: FetchResult, refers_to: str, refers_to_uri: str, refers_to_date: str) -> str:
        """Write request + server-not-modified revisit records for a 304 answer; return the revisit id.

        `refers_to` is the WARC-Record-ID of the record holding the stored body (empty when unknown: the
        record then names the target URI and date only); only the 304's HTTP headers are stored.
        """
        if not result.status:
            raise ValueError(f"no response to archive for {result.url} ({result.error_class})")
        warc_headers = self._common_warc_headers(result)
        warc_headers["WARC-Profile"] = SERVER_NOT_MODIFIED
        if refers_to:
            warc_headers["WARC-Refers-To"] = refers_to
        warc_headers["WARC-Refers-To-Target-URI"] = refers_to_uri
        if refers_to_date:
            warc_headers["WARC-Refers-To-Date"] = refers_to_date
        revisit = self._builder.create_warc_record(
            result.url, "revisit", http_headers=_stored_response_headers(result), warc_headers_dict=warc_headers
        )
        return self._write_with_request(result, revisit)

    def close(self) -> None:
        """Finish the current file (rename it to its final name); later writes raise."""
        with self._lock:
            self._finish_file()
            self._closed = True

    def __enter__(self) -> WarcWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def current_path(self) -> Path | None:
        """The `.open` file being written, if any."""
        return self._path

    # --- internals --------------------------------------------------------------------------------

    def _common_warc_headers(self, result: FetchResult) -> dict[str, str]:
        headers = {"WARC-Date": _warc_date(result.started_at)}
        if result.remote_ip:
            headers["WARC-IP-Address"] = result.remote_ip
        return headers

    def _write_with_request(self, result: FetchResult, record: Any) -> str:
        record_id = str(record.rec_headers.get_header("WARC-Record-ID"))
        request = self._builder.create_warc_record(
            result.url,
            "request",
            warc_headers_dict={
                "WARC-Date": record.rec_headers.get_header("WARC-Date"),
                "WARC-Concurrent-To": record_id,
            },
            http_headers=_request_headers(result),
        )
        data = self._serialize(record) + self._serialize(request)
        with self._lock:
            if self._closed:
                raise ValueError("WarcWriter is closed")
            if self._file is None:
                self._open_file()
            self._write(data)
            if self._size >= self.max_file_bytes:
                self._finish_file()
        return record_id

    def _serialize(self, record: Any) -> bytes:
        """One record as its own gzip member."""
        raw = io.BytesIO()
        WARCWriter(raw, gzip=False, warc_version=self._builder.warc_version).write_record(record)
        packer = zlib.compressobj(self.compress_level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return packer.compress(raw.getvalue()) + packer.flush()

    def _open_file(self) -> None:
        stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S%f")[:17]
        while True:
            self._serial += 1
            name = f"{self.prefix}-{stamp}-{self._serial:05d}.warc.gz"
            final = self.out_dir / name
            partial = self.out_dir / (name + ".open")
            if final.exists():
                continue
            try:
                handle = open(partial, "xb", buffering=0)  # noqa: SIM115 - held open across calls
            except FileExistsError:
                continue
            break
        assert isinstance(handle, io.FileIO)
        self._file, self._path, self._size = handle, partial, 0
        fields = {
            "software": self.software,
            "format": "WARC File Format 1.0",
            "conformsTo": "http://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.0/",
            "hostname": socket.gethostname(),
            **self.info,
        }
        self._write(self._serialize(self._builder.create_warcinfo_record(name, fields)))

    def _write(self, data: bytes) -> None:
        assert self._file is not None
        view = memoryview(data)
        while view:
            written = self._file.write(view)
            if not written:
                raise OSError("short write to WARC file")
            view = view[written:]
        if self.fsync:
            os.fsync(self._file.fileno())
        self._size += len(data)

    def _finish_file(self) -> None:
        if self._file is None or self._path is None:
            return
        self._file.close()
        final = self._path.with_name(self._path.name.removesuffix(".open"))
        os.replace(self._path, final)
        self.files.append(final)
        self._file, self._path, self._size = None, None, 0
