"""The argument parser of `hostring`: one-line usage errors, defaults in every --help, checked values, and a
record of every option so that the same settings can come from HOSTRING_* variables and TOML files.

Every option added to a `Parser` (directly, or through its argument groups) is kept in `Parser.options`, which
`hostring_cli.settings` reads. Value checks are argparse `type=` functions, so a bad value given as a flag, an
environment variable or a settings-file entry is refused by the same words, before anything is started.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import math
import re
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from hostring.agent import product_token
from hostring.text import unsendable_at

MAX_RESPONSE_BYTES = 10 * 2**20
"""The default of --max-response-bytes (`hostring crawl` and `hostring worker`): the largest body read, on the
wire."""

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOTHING_FETCHED = 3
EXIT_STOPPED = 130
EXIT_CODES = (
    "Exit codes: 0 the work ended (a crawl drained, hit its budget or duration, or only deferred work was left); "
    "1 an error (a dependency unreachable, a process that died); 2 a usage error (a bad flag, value, file or "
    "setting: nothing was started); 3 nothing fetchable (the crawl ended without fetching a single page); 130 "
    "stopped by Ctrl-C or SIGTERM (a crawl resumes with --resume)."
)


class UsageError(Exception):
    """A mistake in what the user asked for: exit 2 with one line naming the thing and the fix."""


@dataclass(frozen=True)
class Option:
    """One option of a parser, as added: the argparse action and the `action=` keyword it was added with."""

    action: argparse.Action
    kind: str  # "store", "store_true", "append", "version", "help", ...

    @property
    def dest(self) -> str:
        return self.action.dest

    @property
    def flag(self) -> str:
        """The long spelling (--max-depth), or the dest for a positional."""
        longs = [s for s in self.action.option_strings if s.startswith("--")]
        return longs[0] if longs else self.action.dest


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (exit 2), whose help shows every default, and which
    records its options (`options`) and its subcommands (`commands`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options: list[Option] = []
        self.commands: dict[str, Parser] = {}
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ recording

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        return self._record(super().add_argument, args, kwargs)

    def add_argument_group(self, *args: Any, **kwargs: Any) -> argparse._ArgumentGroup:
        group = super().add_argument_group(*args, **kwargs)
        self._wrap(group)
        return group

    def add_mutually_exclusive_group(self, **kwargs: Any) -> argparse._MutuallyExclusiveGroup:
        group = super().add_mutually_exclusive_group(**kwargs)
        self._wrap(group)
        return group

    def add_subparsers(self, **kwargs: Any) -> argparse._SubParsersAction[Parser]:  # type: ignore[override]
        kwargs.setdefault("parser_class", Parser)
        sub: argparse._SubParsersAction[Parser] = super().add_subparsers(**kwargs)
        add_parser = sub.add_parser

        def add(name: str, **kw: Any) -> Parser:
            parser = add_parser(name, **kw)
            parser.set_defaults(leaf_parser=parser)  # the deepest command's parser, for settings()
            self.commands[name] = parser
            return parser

        sub.add_parser = add  # type: ignore[method-assign]
        return sub

    def _wrap(self, group: argparse._ActionsContainer) -> None:
        add = group.add_argument

        def add_argument(*args: Any, **kwargs: Any) -> argparse.Action:
            return self._record(add, args, kwargs)

        group.add_argument = add_argument  # type: ignore[method-assign]

    def _record(
        self, add: Callable[..., argparse.Action], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> argparse.Action:
        text = kwargs.get("help")
        if isinstance(text, str) and "%(default)" not in text and _shows_default(kwargs.get("default")):
            kwargs["help"] = f"{text} (default: %(default)s)"
        action = add(*args, **kwargs)
        kind = kwargs.get("action", "store")
        self.options.append(Option(action, kind if isinstance(kind, str) else "custom"))
        return action

    def all_options(self) -> list[Option]:
        """This parser's options and, for the commands under it, theirs too (help checks)."""
        out = list(self.options)
        for sub in self.commands.values():
            out += sub.all_options()
        return out

    # ------------------------------------------------------------------ errors

    def error(self, message: str) -> NoReturn:
        """One line, naming the command and where to look, and exit 2 (argparse prints the whole usage). It starts
        "hostring: " like every other error line of the command."""
        self.exit(EXIT_USAGE, f"hostring: {message} (see {self.prog} --help)\n")


def _shows_default(default: object) -> bool:
    return default not in (None, False, "", [], argparse.SUPPRESS)


# ---------------------------------------------------------------------------------------------- value checks


LARGEST = 2**53
"""The largest number (of seconds, pages, bytes) an option takes: beyond it a float no longer holds every integer,
and seconds as int64 milliseconds (a lease's deadline on the wire) overflow."""


def _number(text: str, kind: Callable[[str], float], name: str) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {name}: {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    if abs(value) > LARGEST:
        raise argparse.ArgumentTypeError(f"out of range: {text!r} (at most 2^53 = {LARGEST})")
    return value


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer >= low (and <= high, when given)."""

    def check(text: str) -> int:
        value = int(_number(text, int, "an integer"))
        if high is not None and not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer from {low} to {high}, not {text}")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, not {text}")
        return value

    check.__name__ = f"integer >= {low}" if high is None else f"integer from {low} to {high}"
    return check


def float_at_least(low: float, *, strict: bool = False) -> Callable[[str], float]:
    """A number >= low (> low with strict)."""

    def check(text: str) -> float:
        value = _number(text, float, "a number")
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be a number {'>' if strict else '>='} {low:g}, not {text}")
        return value

    check.__name__ = f"number {'>' if strict else '>='} {low:g}"
    return check


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
non_negative_float = float_at_least(0.0)
positive_float = float_at_least(0.0, strict=True)

MAX_TIMEOUT_S = 86400.0
"""The longest wait for an answer (--timeout, --connect-timeout): a day. gRPC turns a deadline much further off
(1e10 s) into an immediate DEADLINE_EXCEEDED, which reads as a server that is down."""


def timeout_s(text: str) -> float:
    """Seconds to wait for an answer: above zero, at most a day (MAX_TIMEOUT_S)."""
    value = positive_float(text)
    if value > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_TIMEOUT_S:g} seconds (a day), not {text}")
    return value


timeout_s.__name__ = "seconds up to a day"

_DURATION = re.compile(r"^\s*((?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?)\s*(ms|s|m|h|d)?\s*$", re.I)
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_HINT = "give seconds or a number with ms, s, m, h or d, e.g. 90, 90s, 1.5m, 6h or 7d"


def duration(text: str) -> float:
    """Seconds from '90', '90s', '1.5m', '2h', '1d', '500ms' or '1e3' (0 allowed: some options read it as never)."""
    stripped = str(text).strip()
    if stripped.startswith("-") and _DURATION.match(stripped[1:]):
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative; give 0 or a positive duration, e.g. 30s")
    m = _DURATION.match(str(text))
    seconds = float(m.group(1)) * _UNIT_S[(m.group(2) or "s").lower()] if m is not None else math.nan
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; {DURATION_HINT}")
    if seconds > LARGEST:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range (at most 2^53 = {LARGEST} seconds)")
    return seconds


def positive_duration(text: str) -> float:
    """A duration above zero (revisit intervals, retention, a crawl's --duration)."""
    stripped = str(text).strip()
    if stripped.startswith("-") and _DURATION.match(stripped[1:]):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration; {DURATION_HINT}")
    seconds = duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration; {DURATION_HINT}")
    return seconds


positive_duration.__name__ = "positive duration"


def user_agent(text: str) -> str:
    """A --user-agent: it must start with an RFC 9309 product token, the name robots.txt groups are matched by."""
    try:
        product_token(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    at = unsendable_at(text)
    if at is not None:  # sent as a header on every request: a line break there fails every fetch
        raise argparse.ArgumentTypeError(
            f"User-Agent {text!r} has a character an HTTP header cannot carry at position {at} (a line "
            "break, a control or non-ASCII character); use printable ASCII only"
        )
    return text


def cidr(text: str) -> str:
    """An address or network (127.0.0.0/8, 10.1.2.3, ::1/128), as given."""
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not an address or network (CIDR): {text!r}: {e}") from None
    return text


def port(text: str) -> int:
    """A TCP port, 0 (pick a free one) to 65535."""
    value = int_at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a port (0-65535): {text}")
    return value


def host_port(text: str) -> str:
    """HOST:PORT (the port may be 0: pick a free one)."""
    host, sep, p = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}")
    port(p)
    return text


def listen_address(text: str) -> str:
    """HOST:PORT to serve on (--listen). A host written as an IP address must be one (256.1.1.1 is not) and belong
    to this machine (a bind to port 0 tells, sending nothing); a wildcard or a host name is left to the server."""
    host_port(text)
    host = text.rpartition(":")[0]
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if is_wildcard(text) or not re.fullmatch(r"[\d.]+|.*:.*", host):
        return text
    try:
        family, kind, _, _, sockaddr = socket.getaddrinfo(
            host, 0, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
        )[0]
    except socket.gaierror:
        raise argparse.ArgumentTypeError(
            f"{host!r} is not an IP address; give an address of this machine (127.0.0.1), 0.0.0.0 or a host name"
        ) from None
    try:
        with socket.socket(family, kind) as probe:
            probe.bind(sockaddr)
    except OSError as e:
        if e.errno == errno.EADDRNOTAVAIL:
            raise argparse.ArgumentTypeError(
                f"{host} is not an address of this machine ({e.strerror}); give one of its addresses, e.g. "
                "127.0.0.1, or 0.0.0.0 for every interface"
            ) from None
    return text


def address(text: str) -> str:
    """An address to connect to (--node, --coordinator): HOST:PORT or another gRPC target, not blank."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty address; give HOST:PORT")
    if any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"not an address (it holds a space): {text!r}; give HOST:PORT")
    return text


def utf8(text: str) -> str:
    """Text sent to a node as it is (a host, a URL, an id): valid UTF-8, which gRPC requires of a string field (an
    argument with a byte that is not arrives with it as a lone surrogate, '\\udcff')."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"not UTF-8 text: {text!r}") from None
    return text


def nonblank_path(text: str) -> str:
    """A file or directory name (--out, --seeds-file, --config): not blank, which would mean the current directory
    (or, for a file, be ignored)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"an empty path: {text!r}; give a file or directory name")
    return text


def is_wildcard(address: str) -> bool:
    """Whether HOST:PORT listens on every interface (0.0.0.0, ::, or no host)."""
    host = address.rpartition(":")[0].strip("[]")
    return host in ("", "0.0.0.0", "::", "*")


def read_text(path: Path, what: str) -> str:
    """A UTF-8 text file the user named (a seeds or scope file), or a usage error naming it and what is wrong."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise UsageError(f"cannot read {what} {path}: not UTF-8 text (byte {e.start})") from None


def make_dir(path: str, flag: str) -> Path:
    """Directory `path` (and its parents), made now, or a usage error naming `flag` (--out /proc/x, --out FILE)."""
    try:
        made = Path(path)
        made.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot create it ({e.strerror}); give a writable directory") from e
    return made


def die(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print `hostring: message` on stderr and exit (for checks outside the parser)."""
    print(f"hostring: {message}", file=sys.stderr)
    raise SystemExit(code)


def words(items: Sequence[str]) -> str:
    return ", ".join(items)
