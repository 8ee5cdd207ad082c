"""Conditional revisits on the wire and in the WARC: a changing loopback page answering 304 to its validators, and
the worker writing a revisit record (server-not-modified for a 304, identical-payload-digest for an unchanged
200) that refers to the record of the stored body."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from warcio.archiveiterator import ArchiveIterator

from fetch_worker.fetch import Fetcher, FetchResult
from fetch_worker.netpolicy import NetworkPolicy
from fetch_worker.warc import SERVER_NOT_MODIFIED, WarcWriter, payload_digest
from fetch_worker.worker import Worker
from hostring.client import StaticRouter
from hostring.fingerprint import body_digest
from hostring.v1 import frontier_pb2 as pb
from hostring_testing import LocalWeb, Site
from hostring_testing.changing import ChangingPage

UA = "hostring-test/0.1 (+https://example.invalid/revisit-tests)"


def test_a_changing_page_sends_validators_and_answers_304_while_they_match() -> None:
    start = time.time()
    page = ChangingPage(name="p", period_s=1.0, start=start)
    with LocalWeb({"a": Site({"/p": page, "/still": ChangingPage(name="still", start=start)})}) as web:

        async def run() -> list[FetchResult]:
            fetcher = Fetcher(NetworkPolicy(["127.0.0.0/8"]), UA)
            try:
                url = web.url("a", "/p")
                first = await fetcher.fetch(url)
                same = await fetcher.fetch(url, etag=first.etag)
                by_date = await fetcher.fetch(web.url("a", "/still"), last_modified=first.last_modified)
                await asyncio.sleep(max(0.0, start + page.version_at(time.time()) + 1.05 - time.time()))
                changed = await fetcher.fetch(url, etag=first.etag, last_modified=first.last_modified)
                return [first, same, by_date, changed]
            finally:
                await fetcher.aclose()

        first, same, by_date, changed = asyncio.run(run())
        hits = [h for h in web.hits if h.resource != "/robots.txt"]
    assert first.status == 200 and first.etag and first.last_modified and first.body
    assert same.status == 304 and same.body == b"" and same.etag == first.etag
    assert by_date.status == 304  # If-Modified-Since alone, on a page that never changed
    assert changed.status == 200 and changed.etag != first.etag and changed.body != first.body
    assert [h.conditional for h in hits] == [False, True, True, True]


def _worker(tmp_path: Path) -> Worker:
    return Worker(StaticRouter("127.0.0.1:9"), Fetcher(NetworkPolicy([]), UA), warc=WarcWriter(tmp_path))


def _result(status: int, body: bytes) -> FetchResult:
    return FetchResult(
        url="http://a.example/p",
        status=status,
        reason="OK" if status == 200 else "Not Modified",
        http_version="HTTP/1.1",
        headers=[("ETag", '"v1"')] + ([("Content-Length", str(len(body)))] if body else []),
        body=body,
        content_type="text/html" if body else "",
        raw_bytes=len(body),
        decoded_bytes=len(body),
        started_at=1_700_000_100.0,
        request_headers=[("Host", "a.example"), ("If-None-Match", '"v1"')],
    )


def test_the_worker_writes_revisit_records_that_refer_to_the_stored_body(tmp_path: Path) -> None:
    body = b"<html><body>the stored body</body></html>"
    worker = _worker(tmp_path)
    assert worker.warc is not None
    stored = worker._archive(_result(200, body))  # the first fetch: a response record
    lease = pb.LeaseItem(
        url="http://a.example/p", kind=pb.PAGE, revisit=True, refers_to=stored, stored_digest=body_digest(body),
        stored_at_ms=1_700_000_000_000,
    )  # fmt: skip
    not_modified = worker._archive(_result(304, b""), lease)
    unchanged = worker._archive(_result(200, body), lease)
    changed = worker._archive(_result(200, body + b"<p>new</p>"), lease)
    worker.warc.close()
    records = {}
    for path in worker.warc.files:
        with path.open("rb") as stream:
            for record in ArchiveIterator(stream):
                if record.rec_type != "request" and record.rec_type != "warcinfo":
                    records[record.rec_headers.get_header("WARC-Record-ID")] = record.rec_headers
    assert records[stored].get_header("WARC-Type") == "response"
    nm = records[not_modified]
    assert (nm.get_header("WARC-Type"), nm.get_header("WARC-Profile")) == ("revisit", SERVER_NOT_MODIFIED)
    assert nm.get_header("WARC-Refers-To") == stored
    assert nm.get_header("WARC-Refers-To-Target-URI") == "http://a.example/p"
    assert nm.get_header("WARC-Refers-To-Date") == "2023-11-14T22:13:20Z"
    same = records[unchanged]
    assert same.get_header("WARC-Type") == "revisit"
    assert same.get_header("WARC-Profile").endswith("/revisit/identical-payload-digest")
    assert same.get_header("WARC-Refers-To") == stored
    assert same.get_header("WARC-Payload-Digest") == payload_digest(body)
    assert records[changed].get_header("WARC-Type") == "response"
