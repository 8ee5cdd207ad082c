"""WARC output, read back with warcio's own ArchiveIterator."""

from __future__ import annotations

import asyncio
import gzip
import random
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from warcio.archiveiterator import ArchiveIterator

from fetch_worker.fetch import Fetcher, FetchResult
from fetch_worker.netpolicy import NetworkPolicy
from fetch_worker.warc import WarcWriter, payload_digest

NAME = re.compile(r"^hostring-\d{17}-\d{5}\.warc\.gz$")


def page(n: int, body: bytes | None = None, **overrides: Any) -> FetchResult:
    body = body if body is not None else b"<html><body>page %d</body></html>" % n
    result = FetchResult(
        url=f"http://example.com/p{n}?q=1",
        status=200,
        reason="OK",
        http_version="HTTP/1.1",
        headers=[
            ("Content-Type", "text/html; charset=utf-8"),
            ("Content-Length", str(len(body))),
            ("ETag", f'"e{n}"'),
        ],
        body=body,
        content_type="text/html",
        raw_bytes=len(body),
        decoded_bytes=len(body),
        started_at=1_700_000_000.0 + n,
        remote_ip="93.184.215.14",
        request_headers=[("Host", "example.com"), ("User-Agent", "hostring-test/0.1")],
    )
    for key, value in overrides.items():
        setattr(result, key, value)
    return result


def read(path: Path) -> list[Any]:
    """(type, headers, http headers, payload) for each record of a file."""
    records = []
    with path.open("rb") as stream:
        for record in ArchiveIterator(stream):
            payload = record.content_stream().read()
            records.append((record.rec_type, record.rec_headers, record.http_headers, payload))
    return records


def test_fetches_read_back_with_warcio(tmp_path: Path) -> None:
    results = [page(n) for n in range(3)]
    with WarcWriter(tmp_path) as writer:
        ids = [writer.write_fetch(result) for result in results]
    (path,) = writer.files
    assert NAME.match(path.name)
    assert not list(tmp_path.glob("*.open"))

    records = read(path)
    assert [r[0] for r in records] == ["warcinfo"] + ["response", "request"] * 3
    info = records[0][3].decode()
    assert "software: hostring/0.1" in info and "format: WARC File Format 1.0" in info
    assert records[0][1].get_header("WARC-Filename") == path.name
    for n, result in enumerate(results):
        (_, response, http, payload), (_, request, req_http, _) = records[1 + 2 * n : 3 + 2 * n]
        assert response.get_header("WARC-Record-ID") == ids[n]
        assert re.fullmatch(r"<urn:uuid:[0-9a-f-]{36}>", ids[n])
        assert response.get_header("WARC-Target-URI") == result.url
        assert request.get_header("WARC-Target-URI") == result.url
        assert request.get_header("WARC-Concurrent-To") == ids[n]
        assert response.get_header("WARC-Date") == f"2023-11-14T22:13:2{n}Z"
        assert response.get_header("WARC-IP-Address") == "93.184.215.14"
        assert response.get_header("WARC-Payload-Digest") == payload_digest(result.body)
        assert response.get_header("WARC-Truncated") is None
        assert payload == result.body
        assert http.get_statuscode() == "200"
        assert http.protocol == "HTTP/1.1"
        assert http.get_header("ETag") == f'"e{n}"'
        assert http.get_header("Content-Length") == str(len(result.body))
        assert (req_http.protocol, req_http.statusline) == ("GET", f"/p{n}?q=1 HTTP/1.1")
        assert req_http.get_header("User-Agent") == "hostring-test/0.1"


def test_decoded_body_headers_are_stored_honestly(tmp_path: Path) -> None:
    body = b"<html>" + b"x" * 5000 + b"</html>"
    result = page(
        1,
        body,
        headers=[
            ("Content-Type", "text/html"),
            ("Content-Encoding", "gzip"),
            ("Content-Length", "321"),
            ("Vary", "Accept-Encoding"),
        ],
    )
    chunked = page(2, headers=[("Content-Type", "text/html"), ("Transfer-Encoding", "chunked")])
    with WarcWriter(tmp_path) as writer:
        writer.write_fetch(result)
        writer.write_fetch(chunked)
    records = read(writer.files[0])
    http, payload = records[1][2], records[1][3]
    assert payload == body  # warcio would try to gunzip it if Content-Encoding were left in place
    assert http.get_header("Content-Encoding") is None
    assert http.get_header("X-Archive-Orig-Content-Encoding") == "gzip"
    assert http.get_header("X-Archive-Orig-Content-Length") == "321"
    assert http.get_header("Content-Length") == str(len(body))
    assert http.get_header("Vary") == "Accept-Encoding"
    http2, payload2 = records[3][2], records[3][3]
    assert payload2 == chunked.body
    assert http2.get_header("Transfer-Encoding") is None
    assert http2.get_header("X-Archive-Orig-Transfer-Encoding") == "chunked"
    assert http2.get_header("Content-Length") == str(len(chunked.body))


def test_truncated_and_skipped_bodies_are_marked(tmp_path: Path) -> None:
    cut = page(1, b"<p>partial", error_class="too_large", truncated="length")
    skipped = page(2, b"", content_type="application/pdf", body_skipped=True)
    slow = page(3, b"<p>sl", error_class="total_timeout", truncated="time")
    with WarcWriter(tmp_path) as writer:
        for result in (cut, skipped, slow):
            writer.write_fetch(result)
    responses = [r for r in read(writer.files[0]) if r[0] == "response"]
    assert [r[1].get_header("WARC-Truncated") for r in responses] == ["length", "unspecified", "time"]
    assert [r[3] for r in responses] == [b"<p>partial", b"", b"<p>sl"]


def test_rotation_starts_every_file_with_warcinfo(tmp_path: Path) -> None:
    big = b"<html>" + random.Random(7).randbytes(100_000) + b"</html>"  # incompressible
    with WarcWriter(tmp_path, prefix="hostring", max_file_bytes=150_000) as writer:
        ids = [writer.write_fetch(page(n, big)) for n in range(5)]
    files = sorted(tmp_path.glob("*.warc.gz"))
    assert files == sorted(writer.files)
    assert len(files) >= 2
    seen_ids = []
    for path in files:
        assert NAME.match(path.name)
        records = read(path)
        assert records[0][0] == "warcinfo"
        assert [r[0] for r in records[1:]] == ["response", "request"] * ((len(records) - 1) // 2)
        seen_ids += [r[1].get_header("WARC-Record-ID") for r in records if r[0] == "response"]
    assert seen_ids == ids
    assert [int(p.name[-13:-8]) for p in files] == list(range(1, len(files) + 1))


def test_one_record_pair_per_file_when_the_limit_is_tiny(tmp_path: Path) -> None:
    with WarcWriter(tmp_path, max_file_bytes=1) as writer:
        for n in range(3):
            writer.write_fetch(page(n))
    assert len(writer.files) == 3
    assert all([r[0] for r in read(p)] == ["warcinfo", "response", "request"] for p in writer.files)


def test_revisit_refers_to_the_original(tmp_path: Path) -> None:
    body = b"<html>same body</html>"
    original, mirror = page(1, body), page(2, body)
    digest = payload_digest(body)
    with WarcWriter(tmp_path) as writer:
        original_id = writer.write_fetch(original)
        revisit_id = writer.write_revisit(
            mirror, original_id, original.url, digest, refers_to_date="2023-11-14T22:13:21Z"
        )
    records = read(writer.files[0])
    response = next(r for r in records if r[0] == "response")
    assert response[1].get_header("WARC-Payload-Digest") == digest
    kind, headers, http, payload = records[3]
    assert kind == "revisit"
    assert headers.get_header("WARC-Record-ID") == revisit_id != original_id
    assert headers.get_header("WARC-Refers-To") == original_id
    assert headers.get_header("WARC-Refers-To-Target-URI") == original.url
    assert headers.get_header("WARC-Refers-To-Date") == "2023-11-14T22:13:21Z"
    assert headers.get_header("WARC-Target-URI") == mirror.url
    assert headers.get_header("WARC-Payload-Digest") == digest
    assert headers.get_header("WARC-Profile").endswith("/revisit/identical-payload-digest")
    assert http.get_statuscode() == "200"
    assert payload == b""
    assert records[4][0] == "request" and records[4][1].get_header("WARC-Concurrent-To") == revisit_id


def test_revisit_without_a_date_has_no_empty_date_header(tmp_path: Path) -> None:
    with WarcWriter(tmp_path) as writer:
        first = writer.write_fetch(page(1))
        writer.write_revisit(page(2), first, page(1).url, payload_digest(page(1).body))
    revisit = next(r for r in read(writer.files[0]) if r[0] == "revisit")
    assert revisit[1].get_header("WARC-Refers-To-Date") is None


def test_unfinished_file_is_readable_after_a_crash(tmp_path: Path) -> None:
    writer = WarcWriter(tmp_path)
    ids = [writer.write_fetch(page(n)) for n in range(2)]
    # No close(): as a killed process leaves it.
    (partial,) = tmp_path.glob("*.warc.gz.open")
    assert partial == writer.current_path
    records = read(partial)
    assert [r[1].get_header("WARC-Record-ID") for r in records if r[0] == "response"] == ids
    writer.close()
    assert not partial.exists() and writer.files[0].exists()


def test_refuses_results_without_a_response_and_writes_after_close(tmp_path: Path) -> None:
    writer = WarcWriter(tmp_path)
    with pytest.raises(ValueError, match="no response"):
        writer.write_fetch(FetchResult(url="http://example.com/", error_class="connect_error"))
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.write_fetch(page(1))
    writer.close()
    assert writer.files == []  # nothing written, no empty file left behind
    assert list(tmp_path.iterdir()) == []


class _GzipPage(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 5

    def do_GET(self) -> None:
        packed = gzip.compress(LIVE_BODY)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(packed)))
        self.end_headers()
        self.wfile.write(packed)

    def log_message(self, format: str, *args: Any) -> None:
        pass


LIVE_BODY = b"<html><body>" + b"<a href='/x'>x</a>" * 200 + b"</body></html>"


def test_a_real_gzip_fetch_archives_as_its_decoded_body(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _GzipPage)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/page?x=1"

    async def go() -> FetchResult:
        async with Fetcher(NetworkPolicy(allow=["127.0.0.0/8"]), "hostring-test/0.1") as fetcher:
            return await fetcher.fetch(url)

    try:
        result = asyncio.run(go())
    finally:
        server.shutdown()
        server.server_close()
    assert result.ok and result.body == LIVE_BODY and result.raw_bytes < len(LIVE_BODY)
    with WarcWriter(tmp_path) as writer:
        record_id = writer.write_fetch(result)
    _, (_, response, http, payload), (_, request, req_http, _) = read(writer.files[0])
    assert request.get_header("WARC-Concurrent-To") == record_id
    assert response.get_header("WARC-Record-ID") == record_id
    assert response.get_header("WARC-IP-Address") == "127.0.0.1"
    assert payload == LIVE_BODY
    assert http.get_header("X-Archive-Orig-Content-Encoding") == "gzip"
    assert http.get_header("Content-Length") == str(len(LIVE_BODY))
    assert (req_http.protocol, req_http.statusline) == ("GET", "/page?x=1 HTTP/1.1")
    assert req_http.get_header("User-Agent") == "hostring-test/0.1"
    assert req_http.get_header("Accept-Encoding") == "gzip, deflate, br"


def test_payload_digest_format() -> None:
    assert payload_digest(b"") == "sha1:3I42H3S6NNFQ2MSVX7XZKYAYSCX5QBYJ"


def test_a_digest_and_request_target_the_fetch_knew_are_written_as_given(tmp_path: Path) -> None:
    """The worker has the body's payload digest (it dedups by it) and the fetch the request-target it sent: the
    writer takes both rather than work them out again, and the records still check."""
    known = page(1, request_target="/p1?q=%C3%A9")
    as_told = page(2)
    with WarcWriter(tmp_path) as writer:
        writer.write_fetch(known, payload_digest(known.body))
        writer.write_fetch(as_told, "sha1:" + "A" * 32)
    (path,) = writer.files
    with path.open("rb") as stream:
        for record in ArchiveIterator(stream, check_digests="raise"):
            if record.rec_type == "response" and record.rec_headers.get_header("WARC-Target-URI") == known.url:
                record.content_stream().read()  # the digest check runs over the payload read
                assert record.rec_headers.get_header("WARC-Payload-Digest") == payload_digest(known.body)
            elif record.rec_type == "response":
                assert record.rec_headers.get_header("WARC-Payload-Digest") == "sha1:" + "A" * 32
                break
            elif record.rec_type == "request":
                assert record.http_headers.statusline == "/p1?q=%C3%A9 HTTP/1.1"
