"""What the wheel promises about itself: every package it ships is marked typed (PEP 561)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parent.parent


def test_every_shipped_package_has_py_typed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert "py.typed" in config["package-data"]["*"]
    packages = find_packages(str(ROOT), include=config["packages"]["find"]["include"])
    top = sorted({p.split(".")[0] for p in packages})
    assert top, "pyproject.toml ships no package"
    assert [p for p in top if not (ROOT / p / "py.typed").is_file()] == [], "add an empty py.typed to these"
