"""Where a command's settings come from: flags, HOSTRING_* environment variables, a TOML settings file, and (for
`hostring crawl --resume`) the settings the crawl stored in its directory.

Precedence, highest first: a flag on the command line, an environment variable (HOSTRING_ and the option's name
in capitals, e.g. HOSTRING_MAX_DEPTH), a --config FILE (HOSTRING_CONFIG), the crawl's stored settings (on
--resume), the built-in default. Every value goes through the option's own check, whatever its source, and a
bad one is a usage error naming its source (the variable, the file and key).

A settings file is TOML. Keys are the long flags without the dashes (`max-depth = 5`, `max_depth` works too);
top-level keys apply to every command that has that option, a table named after a command (`[crawl]`, `[node]`,
`[worker]`) to that command only. A repeatable flag takes a list (`allow-network = ["127.0.0.0/8"]`), a switch
true or false. The file a crawl stores (OUT/crawl.toml) is itself such a file.
"""

from __future__ import annotations

import argparse
import json
import time
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hostring_cli.args import Option, Parser, UsageError

ENV_PREFIX = "HOSTRING_"
CONFIG_ENV = "HOSTRING_CONFIG"
SETTINGS_HELP = (
    "Every option can also be set by an environment variable, HOSTRING_ and its name in capitals "
    "(HOSTRING_MAX_DEPTH=5; repeatable options comma-separated), or in a TOML file given with --config FILE "
    "or HOSTRING_CONFIG (max-depth = 5). Precedence: flag > environment > file > default."
)
# Keys a settings file may hold that are not options: seeds (start URLs of a crawl), runs (a crawl's history).
RESERVED_KEYS = frozenset({"seeds", "runs"})
_KINDS = frozenset({"store", "store_true", "append"})
_NOT_SETTINGS = frozenset({"help", "version", "config", "leaf_parser", "func"})
_UNSET = object()
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def settable(options: Iterable[Option]) -> dict[str, Option]:
    """The options that may come from the environment or a file, by dest (flags only, not positionals)."""
    return {
        o.dest: o
        for o in options
        if o.kind in _KINDS and o.action.option_strings and o.dest not in _NOT_SETTINGS and o.dest != "SUPPRESS"
    }


def key_of(option: Option) -> str:
    """The settings-file key of an option: its long flag without the dashes."""
    return option.flag.lstrip("-")


def env_of(option: Option) -> str:
    return ENV_PREFIX + option.dest.upper()


# ---------------------------------------------------------------------------------------------- conversion


def convert(option: Option, raw: object, where: str) -> Any:
    """A raw value (text from the environment, a TOML value) checked and converted as the flag would be."""
    try:
        if option.kind == "store_true":
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
            raise argparse.ArgumentTypeError(f"not true or false: {raw!r}")
        if option.kind == "append":
            if isinstance(raw, list):
                items: list[object] = list(raw)
            elif isinstance(raw, str):
                items = [part.strip() for part in raw.split(",") if part.strip()]
            else:
                items = [raw]
            return [_one(option, item) for item in items]
        return _one(option, raw)
    except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
        raise UsageError(f"{where}: {e}") from None


def _one(option: Option, raw: object) -> Any:
    if isinstance(raw, bool | list | dict):
        raise argparse.ArgumentTypeError(f"expected a single value for {option.flag}, not {raw!r}")
    text = raw if isinstance(raw, str) else str(raw)
    kind = option.action.type
    value = kind(text) if callable(kind) else text
    choices = option.action.choices
    if choices is not None and value not in choices:
        raise argparse.ArgumentTypeError(f"invalid choice {value!r} (choose from {', '.join(map(str, choices))})")
    return value


# ---------------------------------------------------------------------------------------------- files


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """A TOML file, or a usage error naming it."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"{what} {path}: no such file") from None
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot read it ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{what} {path}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} {path}: not valid TOML: not UTF-8 text (byte {e.start})") from None


def file_layer(
    data: Mapping[str, Any],
    options: Mapping[str, Option],
    command: str,
    *,
    known: set[str],
    commands: Iterable[str],
    where: str,
) -> dict[str, Any]:
    """The values a settings file gives this command (dest -> converted value).

    A top-level key that no command knows is an error (a typo), one that another command knows is skipped.
    """
    by_key = {key_of(o): o for o in options.values()}
    out: dict[str, Any] = {}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    flat = {k: v for k, v in data.items() if not isinstance(v, dict)}
    for name in tables:
        if name != command and name not in commands and name not in RESERVED_KEYS:
            raise UsageError(f"{where}: unknown table [{name}] (tables are named after commands: [crawl], [node])")
    for scope, entries, strict in (("", flat, False), (command, tables.get(command, {}), True)):
        for raw_key, value in entries.items():
            key = raw_key.replace("_", "-")
            if key in RESERVED_KEYS:
                continue
            option = by_key.get(key)
            if option is None:
                if strict or key not in known:
                    hint = f" in [{scope}]" if scope else ""
                    raise UsageError(f"{where}: unknown setting {raw_key!r}{hint}; the keys are the long flags of "
                                     f"`hostring {command} --help` without the dashes")  # fmt: skip
                continue
            out[option.dest] = convert(option, value, f"{where}: {raw_key}")
    return out


def env_layer(env: Mapping[str, str], options: Mapping[str, Option]) -> dict[str, tuple[Any, str]]:
    """The values HOSTRING_* variables give (dest -> (converted value, variable name))."""
    out: dict[str, tuple[Any, str]] = {}
    for dest, option in options.items():
        name = env_of(option)
        if name in env:
            out[dest] = (convert(option, env[name], f"{name}={env[name]!r}"), name)
    return out


# ---------------------------------------------------------------------------------------------- resolution


@dataclass
class Settings:
    """A command's settings, resolved: the values by dest and where each came from."""

    values: dict[str, Any]
    sources: dict[str, str]
    options: dict[str, Option]
    config: dict[str, Any] = field(default_factory=dict)  # the settings file's raw content (for reserved keys)

    def changes(self, stored: Mapping[str, Any], skip: Iterable[str] = ()) -> list[str]:
        """Human notes for each value given now (flag, environment, file) that differs from a stored one."""
        notes = []
        skipped = set(skip)
        for dest, value in self.values.items():
            source = self.sources.get(dest, "default")
            if source == "default" or source.startswith("stored") or dest not in self.options or dest in skipped:
                continue
            before = stored.get(dest, self.options[dest].action.default)
            if before != value:
                notes.append(f"{key_of(self.options[dest])} {show(value)} (was {show(before)}, from {source})")
        return notes


def show(value: object) -> str:
    if value is None or value == []:
        return "none"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def given_flags(parser: Parser, leaf: Parser, argv: list[str]) -> dict[str, Any]:
    """The options of `leaf` (and the top-level ones) given on the command line, with their parsed values.

    The command line is parsed once more with every default replaced by a marker: what is not the marker was given.
    """
    options = [o for o in (*parser.options, *leaf.options) if o.kind in _KINDS]
    saved = [(o.action, o.action.default) for o in options]
    try:
        for o in options:
            if o.action.default is not argparse.SUPPRESS:  # global flags repeated after a command: left alone
                o.action.default = None if o.kind == "append" else _UNSET
        parsed = vars(parser.parse_args(argv))
    finally:
        for action, default in saved:
            action.default = default
    return {o.dest: parsed[o.dest] for o in options if o.dest in parsed and parsed[o.dest] not in (None, _UNSET)}


def resolve(
    parser: Parser,
    args: argparse.Namespace,
    argv: list[str],
    env: Mapping[str, str],
    *,
    stored: Mapping[str, Any] | None = None,
    stored_name: str = "stored",
) -> Settings:
    """Fill `args` from flags, environment, --config file, stored settings and defaults (see the module doc)."""
    leaf: Parser = getattr(args, "leaf_parser", parser)
    command = " ".join(leaf.prog.split()[1:]) or "hostring"
    options = settable([*leaf.options, *parser.options])  # a global flag: the top-level option (its default)
    flags = given_flags(parser, leaf, argv)
    values = {dest: getattr(args, dest, o.action.default) for dest, o in options.items()}  # parsed defaults
    sources = dict.fromkeys(values, "default")
    for dest, value in (stored or {}).items():
        if dest in options:
            values[dest], sources[dest] = value, stored_name
    config_path = getattr(args, "config", None) or env.get(CONFIG_ENV) or ""
    config: dict[str, Any] = {}
    if config_path:
        config = read_toml(Path(config_path), "--config")
        known = {key_of(o) for o in settable(parser.all_options()).values()}
        layer = file_layer(
            config, options, command.split()[0], known=known, commands=parser.commands, where=config_path
        )
        for dest, value in layer.items():
            values[dest], sources[dest] = value, f"--config {config_path}"
    for dest, (value, name) in env_layer(env, options).items():
        values[dest], sources[dest] = value, name
    for dest, value in flags.items():
        if dest in options:
            values[dest], sources[dest] = value, options[dest].flag
    for dest, value in values.items():
        if sources[dest] != "default":
            setattr(args, dest, value)
    return Settings(values, sources, options, config)


# ---------------------------------------------------------------------------------------------- stored settings


def toml_value(value: object) -> str:
    """A TOML literal for a setting's value (bool, int, float, str or a list of them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def read_stored(path: Path, options: Mapping[str, Option]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(settings by dest, the raw file) of a crawl's stored settings; a usage error if they cannot be read."""
    data = read_toml(path, "stored settings")
    _check_lists(path, data)
    by_key = {key_of(o): o for o in options.values()}
    values: dict[str, Any] = {}
    for raw_key, value in data.items():
        option = by_key.get(raw_key.replace("_", "-"))
        if option is not None:
            values[option.dest] = convert(option, value, f"{path}: {raw_key}")
    return values, data


def _check_lists(path: Path, data: Mapping[str, Any]) -> None:
    """The seeds and runs of stored settings are a list of URLs and a list of tables; anything else (a hand-edited
    seeds = "https://...") is a usage error, before the file is rewritten from it."""
    seeds, runs = data.get("seeds", []), data.get("runs", [])
    if not isinstance(seeds, list) or not all(isinstance(s, str) for s in seeds):
        raise UsageError(
            f'{path}: seeds must be a list of URLs, e.g. seeds = ["https://example.org/"], not {seeds!r}; fix the '
            "file and resume again"
        )
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise UsageError(
            f"{path}: runs must be a list of [[runs]] tables (the crawl's history), not {runs!r}; fix the file or "
            "remove the runs line, and resume again"
        )


def run_record(kind: str, changes: list[str]) -> dict[str, Any]:
    """One entry of a crawl's history: when it ran, how (start or resume), and what changed."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"started": started, "how": kind, "changed": changes}
