"""Run a benchmark's quick JSON mode as a subprocess and check its figures: the shared part of the bench smoke tests.

The smoke tests check that each bench works end to end and prints every figure finite and positive, never how fast
anything is.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def run_quick(module: str, timeout: float, *extra: str) -> dict[str, Any]:
    """`python -m MODULE --quick --json [extra]` from the repository root; its JSON, or AssertionError with stderr."""
    out = subprocess.run(
        [sys.executable, "-m", module, "--quick", "--json", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    figures: dict[str, Any] = json.loads(out.stdout)
    return figures


def assert_positive(figures: Mapping[str, Any], keys: Iterable[str], where: str = "") -> None:
    """Every figure named is a finite number above zero."""
    for key in keys:
        value = figures.get(key)
        assert isinstance(value, int | float) and math.isfinite(value) and value > 0, (where, key, value)
