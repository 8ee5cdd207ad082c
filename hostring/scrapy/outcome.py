"""What a Complete says about a Scrapy download: status, timings, digest and simhash, redirect target, error class.

The same facts the fetch worker reports (see fetch_worker/worker.py), read from a Scrapy Response or the
exception a download failed with. Error classes use the node's vocabulary (frontier_node/core/retry.py), so a
timeout or a refused connection is retried with backoff and anything unknown fails for good.
"""

from __future__ import annotations

from OpenSSL import SSL
from scrapy.exceptions import (
    CannotResolveHostError,
    DownloadCancelledError,
    DownloadConnectionRefusedError,
    DownloadFailedError,
    DownloadTimeoutError,
    IgnoreRequest,
    ResponseDataLossError,
    UnsupportedURLSchemeError,
)
from scrapy.http import Response
from twisted.internet import error as twisted_error
from w3lib.url import safe_url_string

from hostring.fingerprint import SIMHASH_TEXT_CHARS, body_digest, simhash64
from hostring.html import page_text
from hostring.limits import MAX_ROBOTS_BODY_BYTES
from hostring.retry_after import parse_retry_after
from hostring.v1 import frontier_pb2 as pb

ROBOTS_MAX_BYTES = MAX_ROBOTS_BODY_BYTES
"""RFC 9309 §2.5: parse at least 500 KiB; the node caps there too."""
_DETAIL_MAX = 500

# Most specific first: Scrapy's own exception types (2.13+), then Twisted's, then TLS.
_ERROR_CLASSES: tuple[tuple[tuple[type[BaseException], ...], str], ...] = (
    ((DownloadTimeoutError, twisted_error.TimeoutError, twisted_error.TCPTimedOutError), "timeout"),
    ((CannotResolveHostError, twisted_error.DNSLookupError), "dns_error"),
    ((DownloadConnectionRefusedError, twisted_error.ConnectError, ConnectionRefusedError), "connect_error"),
    (
        (ResponseDataLossError, twisted_error.ConnectionLost, twisted_error.ConnectionDone, DownloadFailedError),
        "protocol_error",
    ),
    ((SSL.Error,), "tls_error"),
    ((DownloadCancelledError,), "download_cancelled"),
    ((UnsupportedURLSchemeError,), "bad_scheme"),
    ((IgnoreRequest,), "ignored"),
)


def error_class(exc: BaseException) -> str:
    """hostring's name for a download failure; `client_error` for anything else (not retried)."""
    for types, name in _ERROR_CLASSES:
        if isinstance(exc, types):
            return name
    return "client_error"


def _header(response: Response, name: bytes) -> str:
    value = response.headers.get(name)
    return value.decode("latin-1") if value else ""


def response_outcome(response: Response, elapsed_s: float, *, robots: bool, simhash: bool) -> pb.Outcome:
    """The Outcome of a response; a robots item's carries the body, a page's 2xx body its digest (and simhash)."""
    status = response.status
    body = response.body
    outcome = pb.Outcome(
        status=status,
        retry_after_s=parse_retry_after(response.headers.get(b"Retry-After")),
        content_type=_header(response, b"Content-Type"),
        bytes=len(body),
        response_s=max(0.0, elapsed_s),
        remote_ip=str(response.ip_address) if response.ip_address is not None else "",
        etag=_header(response, b"ETag"),
        last_modified=_header(response, b"Last-Modified"),
    )
    if 300 <= status < 400:
        location = response.headers.get(b"Location")
        if location:
            outcome.location = safe_url_string(location)
    if robots:
        outcome.robots_body = body[:ROBOTS_MAX_BYTES]
    elif status < 300 and body:
        outcome.body_digest = body_digest(body)
        if simhash:  # an HTML page's visible text, as the fetch worker reads it (hostring/html.py)
            outcome.simhash = simhash64(page_text(body, outcome.content_type, SIMHASH_TEXT_CHARS))
    return outcome


def error_outcome(exc: BaseException, elapsed_s: float) -> pb.Outcome:
    """The Outcome of a download that produced no response."""
    detail = f"{type(exc).__name__}: {exc}"[:_DETAIL_MAX]
    return pb.Outcome(error_class=error_class(exc), error_detail=detail, retry_after_s=-1, response_s=elapsed_s)
