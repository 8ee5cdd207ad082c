"""WARC files a killed crawl left `.open` are finished when it resumes: cut after their last whole record group,
renamed to their final name, and read back cleanly by warcio."""

from __future__ import annotations

from pathlib import Path

from fetch_worker.warc import WarcWriter, finalize_open_files
from tests.test_warc import NAME, page, read


def killed_writer(out: Path, prefix: str, records: int) -> Path:
    """A writer that wrote `records` fetches and was never closed (as `kill -9` leaves it); its .open file."""
    writer = WarcWriter(out, prefix=prefix)
    for n in range(records):
        writer.write_fetch(page(n))
    assert writer.current_path is not None
    return writer.current_path


def test_open_files_are_finished_and_read_back(tmp_path: Path) -> None:
    first = killed_writer(tmp_path, "hostring", 3)
    done = finalize_open_files(tmp_path)
    assert len(done) == 1 and not first.exists() and NAME.match(done[0].name)
    records = read(done[0])
    assert [r[0] for r in records] == ["warcinfo"] + ["response", "request"] * 3
    assert finalize_open_files(tmp_path) == []  # nothing left to do


def test_a_torn_last_record_is_cut_off(tmp_path: Path) -> None:
    """Only an OS crash can tear a record group (each is one write), but the finished file must still read: the
    torn tail goes, every whole record stays."""
    partial = killed_writer(tmp_path, "hostring", 2)
    whole = partial.read_bytes()
    with partial.open("ab") as f:
        f.write(whole[-200:-50])  # half a gzip member
    (done,) = finalize_open_files(tmp_path)
    assert done.read_bytes() == whole
    assert [r[0] for r in read(done)] == ["warcinfo", "response", "request", "response", "request"]


def test_only_the_named_writers_files(tmp_path: Path) -> None:
    mine = killed_writer(tmp_path, "hostring-w1", 1)
    other = killed_writer(tmp_path, "hostring-w2", 1)
    (done,) = finalize_open_files(tmp_path, prefix="hostring-w1")
    assert not mine.exists() and other.exists() and done.name.startswith("hostring-w1-")
