"""Logging set-up shared by every hostring process: readable text on a terminal, one JSON object per line otherwise.

A JSON line carries `ts` (UTC, RFC 3339 with milliseconds), `level`, `logger`, `msg`, the crawl's `run_id` when
the process knows it, the fields bound with `bind()` (`node`, `worker`, ...) and `exc` with the traceback when
an exception is logged. Log collectors (Docker, Kubernetes, Loki, ...) read them without parsing rules. In both
forms a message's control characters are escaped (hostring.text), so a logged client string cannot drive a terminal.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from hostring.text import escape_control

FORMATS = ("auto", "text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
_CHATTY = ("httpx", "httpcore", "hpack")

_fields: dict[str, str] = {}
_run_id_getter: Callable[[], str] | None = None


def bind(**fields: str) -> None:
    """Add fields to every later JSON line of this process (e.g. `node="node-1"`); an empty value removes one."""
    for name, value in fields.items():
        if value:
            _fields[name] = str(value)
        else:
            _fields.pop(name, None)


def set_run_id_getter(getter: Callable[[], str] | None) -> None:
    """Where the `run_id` field comes from (called per line: the run id may only be known after start-up)."""
    global _run_id_getter
    _run_id_getter = getter


def _run_id() -> str:
    if _run_id_getter is None:
        return _fields.get("run_id", "")
    try:
        return _run_id_getter()
    except Exception:  # a getter must never break logging
        return ""


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": escape_control(record.getMessage()),
        }
        run_id = _run_id()
        if run_id:
            out["run_id"] = run_id
        for name, value in _fields.items():
            if name != "run_id":
                out.setdefault(name, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT lines whose message shows control characters as escapes (a logged client string cannot drive the
    terminal); a traceback keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_control(super().formatMessage(record))


def resolve_format(fmt: str, stream: TextIO | None = None) -> str:
    """'text' or 'json' for a --log-format value: 'auto' is text on a terminal and JSON otherwise."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if fmt != "auto":
        return fmt
    s = stream or sys.stderr
    try:
        return "text" if s.isatty() else "json"
    except (AttributeError, ValueError):
        return "json"


class StatusLine:
    """A live one-line display at the bottom of a terminal (a crawl's progress). Log records and notices are
    printed above it: the line is cleared, the text written, and the line drawn again, so nothing tears it."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.text = ""
        self.lock = threading.RLock()

    def show(self, text: str) -> None:
        """Draw (or redraw) the line; `text` should fit the terminal's width."""
        with self.lock:
            self.text = text
            self.stream.write("\r" + text + "\x1b[K")
            self.stream.flush()

    def above(self, write: Callable[[], object]) -> None:
        """Run `write` (which prints whole lines) with the line out of the way, then draw it again."""
        with self.lock:
            if self.text:
                self.stream.write("\r\x1b[K")
            write()
            if self.text:
                self.stream.write("\r" + self.text + "\x1b[K")
            self.stream.flush()

    def print(self, line: str) -> None:
        """One line of text above the status line."""
        self.above(lambda: self.stream.write(line + "\n"))

    def close(self) -> None:
        """Leave the last line on the screen and move below it; later output goes on as usual."""
        with self.lock:
            if self.text:
                self.stream.write("\n")
                self.stream.flush()
            self.text = ""


_status: StatusLine | None = None


def set_status_line(status: StatusLine | None) -> None:
    """Route this process's log records above `status` while it is shown (None: back to plain lines)."""
    global _status
    _status = status


class _StatusAwareHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that prints above the status line when one is shown on the same stream."""

    def emit(self, record: logging.LogRecord) -> None:
        status = _status
        if status is not None and status.stream is self.stream and status.text:
            status.above(lambda: super(_StatusAwareHandler, self).emit(record))
        else:
            super().emit(record)


def setup_logging(
    level: str | int = "INFO",
    json: bool = False,
    run_id_getter: Callable[[], str] | None = None,
    *,
    stream: TextIO | None = None,
) -> None:
    """Configure the root logger once for the process (replacing any handlers), and quiet the HTTP client's logs."""
    handler = _StatusAwareHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json else TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    if run_id_getter is not None:
        set_run_id_getter(run_id_getter)
    for chatty in _CHATTY:
        logging.getLogger(chatty).setLevel(max(logging.WARNING, root.level))
