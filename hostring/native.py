"""The node's hot modules compiled with mypyc: which ones, whether they are built, and a guard against stale builds.

`python scripts/native.py build` compiles MODULES in place (an extension module beside each source, which Python
imports instead of the .py); `clean` removes them. The code is the same either way: tests/test_native.py runs the
core's tests against the compiled modules. Compiled, a node admits and settles about 1.15-1.4x as many URLs per CPU
second (bench/node.py says which build it measured).

An extension built from an older source would run instead of the source as it is now, silently: importing
hostring or frontier_node refuses that (StaleNativeBuild) rather than run code nobody is reading.
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
"""The directory that holds the hostring and frontier_node packages (the repository root in a checkout)."""

MODULES: Final = (
    "frontier_node/core/budgets.py",
    "frontier_node/core/config.py",
    "frontier_node/core/dedup.py",
    "frontier_node/core/front.py",
    "frontier_node/core/frontier.py",
    "frontier_node/core/handback.py",
    "frontier_node/core/hosts.py",
    "frontier_node/core/journal.py",
    "frontier_node/core/leases.py",
    "frontier_node/core/records.py",
    "frontier_node/core/retry.py",
    "frontier_node/core/revisit_items.py",
    "frontier_node/core/robots_items.py",
    "frontier_node/core/states.py",
    "frontier_node/ops.py",
    "frontier_node/core_thread.py",
    "frontier_node/core/robots.py",
    "frontier_node/core/robots_index.py",
    "frontier_node/core/revisit.py",
    "frontier_node/store/sqlite.py",
    "frontier_node/validate.py",
    "hostring/targets.py",
)
"""Sources compiled, relative to ROOT: the core, the SQLite store, the core thread with the ops and checks a call runs
through, and the URL fast path. Everything else stays interpreted: service.py (mypyc compiles no async generator),
commit.py (its runtime-checkable protocols), hostring/urls.py (it writes a frozen dataclass's slots directly)."""

GROUP: Final = "frontier_node.native"
"""mypyc's shared library (its runtime and every module's code) is `frontier_node/native__mypyc.*.so`."""

_SUFFIXES: Final = tuple(importlib.machinery.EXTENSION_SUFFIXES)


class StaleNativeBuild(ImportError):
    """A compiled module is older than its source: rebuild (scripts/native.py build) or remove them (clean)."""


def extension_of(source: Path) -> Path | None:
    """The compiled module built from `source`, if there is one."""
    for suffix in _SUFFIXES:
        candidate = source.with_suffix(suffix)
        if candidate.exists():
            return candidate
    return None


def built(root: Path = ROOT) -> list[str]:
    """The MODULES (under `root`) that have a compiled module beside them."""
    return [m for m in MODULES if extension_of(root / m) is not None]


def check(root: Path = ROOT) -> None:
    """Raise StaleNativeBuild when a source in MODULES (under `root`) changed after its compiled module was built."""
    stale = []
    for module in MODULES:
        source = root / module
        extension = extension_of(source)
        if extension is not None and source.stat().st_mtime > extension.stat().st_mtime:
            stale.append(module)
    if stale:
        raise StaleNativeBuild(
            f"{', '.join(stale)} changed after {'it was' if len(stale) == 1 else 'they were'} compiled: run "
            "`python scripts/native.py build` again, or `python scripts/native.py clean` to run from the sources"
        )
