"""Text that reaches an operator's terminal: control characters escaped, so a client cannot drive the terminal.

Strings a client or a crawled server chose (error classes, reasons, URLs, robots notes) end up in reports, CLI
tables and log lines. An ANSI escape sequence (ESC, CSI), a carriage return or a bidirectional override in them
would recolour, overwrite or reorder what the operator reads; `escape_control` shows each such character as a
visible `\\xNN` / `\\uNNNN` escape instead. Printable text, including non-ASCII letters, passes unchanged.
"""

from __future__ import annotations

import re
from typing import Any, Final

# C0 controls, DEL, C1 controls (0x9b is CSI on 8-bit terminals), the Arabic letter mark and the bidirectional
# marks, embeddings, overrides and isolates (they reorder what a terminal shows).
_CONTROL: Final = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def has_control(text: str) -> bool:
    """Whether `text` holds a character that `escape_control` would escape."""
    if text.isascii() and text.isprintable():
        return False
    return _CONTROL.search(text) is not None


def unsendable_at(text: str) -> int | None:
    """The 1-based position of the first character a header cannot carry (HTTP's User-Agent, gRPC metadata):
    anything but printable ASCII. None when there is none."""
    if text.isascii() and text.isprintable():
        return None
    return next(i for i, ch in enumerate(text, 1) if not " " <= ch <= "~")


def escape_control(text: str) -> str:
    """`text` with every control, DEL, C1 and bidirectional-control character written as a visible escape."""
    if text.isascii() and text.isprintable():
        return text
    return _CONTROL.sub(_escape, text)


def escape_tree(value: Any) -> Any:
    """A copy of a JSON-like value (dicts, lists, tuples, strings, numbers) with every string escaped, keys too."""
    if isinstance(value, str):
        return escape_control(value)
    if isinstance(value, dict):
        return {escape_tree(k): escape_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [escape_tree(v) for v in value]
    return value
