"""Parsing this repository's sources in tests, safe beside other threads that parse (CPython 3.11's gh-106905)."""

from __future__ import annotations

import ast
import gc
from typing import Literal


def parse_text(source: str, filename: str = "<string>", mode: Literal["exec", "eval"] = "exec") -> ast.AST:
    """ast.parse with the garbage collector off. CPython 3.11.7 keeps the AST conversion's recursion counter in state
    every thread shares, and raised "SystemError: AST constructor recursion depth mismatch" in CI twice (pytest
    workers with other threads, which parse too: 3.11's traceback formatting calls ast.parse; gh-106905, fixed in
    3.11.8). The conversion is C code: another thread's parse can only slip into its middle if Python code runs
    there, which a collection's finalizers would; with the collector off none does."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename=filename, mode=mode)
    finally:
        if enabled:
            gc.enable()


def parse_module(source: str, filename: str = "<string>") -> ast.Module:
    """A whole module's source, parsed as parse_text does."""
    tree = parse_text(source, filename)
    assert isinstance(tree, ast.Module)
    return tree
