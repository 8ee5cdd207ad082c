"""The compiled core (hostring/native.py, scripts/native.py): the same tests pass against it, and a compiled module
older than its source is refused rather than run.

The build runs in a copy of the repository, so this checkout's own modules stay as they are.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from hostring.native import MODULES, ROOT, StaleNativeBuild, built, check

pytestmark = [pytest.mark.timeout(900)]

# The core's own tests, the SQLite store's, and the shell's in-process ones (its core thread, ops and request
# checks): every compiled module runs in them.
COMPILED_SUITE = (
    "tests/test_core_surface.py",
    "tests/test_core_property.py",
    "tests/test_core_repeat.py",
    "tests/test_core_handback.py",
    "tests/test_core_robots.py",
    "tests/test_core_window.py",
    "tests/test_core_bodies.py",
    "tests/test_core_store_faults.py",
    "tests/test_store_sqlite.py",
    "tests/test_store_contract.py",
    "tests/test_lease_write_behind.py",
    "tests/test_handoff_core.py",
    "tests/test_revisit_core.py",
    "tests/test_budgets.py",
    "tests/test_dedup.py",
    "tests/test_host_politeness.py",
    "tests/test_wire_limits.py",
    "tests/test_node_shell.py",
    "tests/test_commit_pipeline.py",
    "tests/test_revisit_node.py",
)


def _extension_beside_source(root: Path, module: str) -> Path:
    """Write `module`'s source under `root`; the path its compiled module would have."""
    source = root / module
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text("x = 1\n")
    return source.with_suffix(sysconfig.get_config_var("EXT_SUFFIX"))


def test_an_extension_older_than_its_source_is_refused(tmp_path: Path) -> None:
    extension = _extension_beside_source(tmp_path, MODULES[0])
    check(tmp_path)  # no extension: the source runs
    assert built(tmp_path) == []
    extension.write_bytes(b"")
    past = time.time() - 60
    os.utime(extension, (past, past))
    assert built(tmp_path) == [MODULES[0]]
    with pytest.raises(StaleNativeBuild, match=r"native\.py build"):
        check(tmp_path)
    os.utime(extension)  # rebuilt: newer than its source
    check(tmp_path)


def _can_compile() -> str:
    """Why the compiled suite cannot run here ('' when it can)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return "not a git checkout (the repository is copied by `git ls-files`)"
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc (part of mypy, the test extra) is not installed"
    if shutil.which(sysconfig.get_config_var("CC").split()[0] or "cc") is None:
        return "no C compiler"
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        return "no Python headers (Python.h)"
    return ""


@pytest.mark.long(420)
@pytest.mark.skipif(bool(_can_compile()), reason=_can_compile() or "compiles")
def test_the_core_tests_pass_against_the_compiled_modules(tmp_path: Path) -> None:
    """Build every module of MODULES in a copy of the repository and run the core's tests there: compiled code keeps
    the sources' behaviour (mypyc checks declared types at run time, and its classes differ in small ways)."""
    copy = tmp_path / "repo"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    done = subprocess.run(
        # -O0: the C compiler's optimisations change no behaviour a test can see, and -O3 builds take 1.6 times as long
        [sys.executable, "scripts/native.py", "build", "--opt-level", "0"],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert built(copy) == list(MODULES)
    env = {**os.environ, "PYTHONPATH": str(copy)}
    probe = subprocess.run(
        [sys.executable, "-c", "import frontier_node.core.frontier as f; print(f.__file__)"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip().endswith(sysconfig.get_config_var("EXT_SUFFIX")), probe.stdout
    # --show-capture=no: a failure's report is its traceback, not the logs it captured (which filled the tail below
    # and hid the assertion that failed)
    pytest_args = ["-q", "-n", "0", "-p", "no:cacheprovider", "--tb=short", "--show-capture=no"]
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, *COMPILED_SUITE],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert tests.returncode == 0, tests.stdout[-6000:]
