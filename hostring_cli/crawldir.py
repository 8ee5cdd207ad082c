"""A crawl's directory (OUT): what it holds, the checks made before anything is written, and the clean-up of a
start that failed, so that a rerun is never blocked by a half-made directory.

OUT holds the node's store (frontier.sqlite3), the crawl's settings (crawl.toml: readable, and a --config file),
the node's log (node.log), WARC files (warc/) and the report (report.json); with --workers N, the further workers'
log (workers.log) and the counts they report (workers/).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from hostring_cli.args import UsageError

STORE_NAME = "frontier.sqlite3"
SETTINGS_NAME = "crawl.toml"
NODE_LOG = "node.log"
WORKERS_LOG = "workers.log"
WORKERS_DIR = "workers"
WARC_DIR = "warc"
REPORT_NAME = "report.json"
LOCK_NAME = ".lock"
_STORE_FILES = (STORE_NAME, STORE_NAME + "-wal", STORE_NAME + "-shm")


@dataclass
class CrawlDir:
    """The paths of one crawl directory."""

    path: Path

    @property
    def store(self) -> Path:
        return self.path / STORE_NAME

    @property
    def settings(self) -> Path:
        return self.path / SETTINGS_NAME

    @property
    def node_log(self) -> Path:
        return self.path / NODE_LOG

    @property
    def workers_log(self) -> Path:
        return self.path / WORKERS_LOG

    @property
    def workers(self) -> Path:
        return self.path / WORKERS_DIR

    @property
    def warc(self) -> Path:
        return self.path / WARC_DIR

    @property
    def report(self) -> Path:
        return self.path / REPORT_NAME

    def lock(self) -> IO[str]:
        """Hold OUT for this process (released when it ends, however it ends); a usage error while another
        `hostring crawl` holds it: two crawls on one store would hand each other's leases back."""
        handle = open(self.path / LOCK_NAME, "a+", encoding="utf-8")  # noqa: SIM115 - held for the whole crawl
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            raise UsageError(
                f"{self.path} is being crawled by another hostring crawl{f' (pid {holder})' if holder else ''}; "
                "stop it first, or give another --out"
            ) from None
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        return handle

    def check(self, resume: bool) -> None:
        """Refuse, before anything is written, an OUT that cannot be used for this start (or resume)."""
        p = self.path
        if p.exists() and not p.is_dir():
            raise UsageError(f"--out {p} is a file, not a directory; give a directory for the crawl")
        if resume and not self.store.is_file():
            raise UsageError(f"nothing to resume in {p} (no {STORE_NAME}); leave out --resume to start a crawl there")
        if not resume and self.store.exists():
            raise UsageError(f"{p} already holds a crawl; add --resume to continue it, or give another --out")
        if p.exists():
            if not os.access(p, os.W_OK | os.X_OK):
                raise UsageError(f"--out {p} is not writable; give a directory you can write to")
            return
        parent = p.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise UsageError(f"--out {p}: {parent} is a file, not a directory; give another --out")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UsageError(f"--out {p}: cannot create it in {parent} (permission denied); give a writable --out")

    def create(self) -> Made:
        """Make OUT (and its parents); what was made, to undo if the start fails."""
        made = Made(self)
        missing = []
        p = self.path
        while not p.exists():
            missing.append(p)
            p = p.parent
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            made.dirs = [d for d in missing if d.exists()]
            made.undo()
            raise UsageError(f"--out {self.path}: cannot create it ({e.strerror}); give a writable directory") from e
        made.dirs = missing
        made.files = [
            self.path / name for name in (*_STORE_FILES, SETTINGS_NAME, NODE_LOG) if not (self.path / name).exists()
        ]
        made.warc = not self.warc.exists()
        return made


@dataclass
class Made:
    """What a start created in (or as) OUT; `undo()` removes it again after a failed start."""

    crawl_dir: CrawlDir
    dirs: list[Path] = field(default_factory=list)  # OUT and missing parents, deepest first
    files: list[Path] = field(default_factory=list)
    warc: bool = False

    def undo(self) -> None:
        if self.dirs:
            shutil.rmtree(self.dirs[0], ignore_errors=True)
            for d in self.dirs[1:]:
                with contextlib.suppress(OSError):
                    d.rmdir()
            return
        for f in self.files:
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
        if self.warc:
            shutil.rmtree(self.crawl_dir.warc, ignore_errors=True)
