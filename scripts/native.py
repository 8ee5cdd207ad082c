"""Compile the node's hot modules (hostring/native.py MODULES) with mypyc in place, or remove them.

    python scripts/native.py build     # about a minute on 2 cores; needs mypy (the test extra) and a C compiler
    python scripts/native.py build --opt-level 0   # the C compiler's -O0: half the build time, slower code
    python scripts/native.py clean     # back to the sources
    python scripts/native.py status    # which modules are compiled

Run from anywhere; it works in the repository root. The C sources and objects go to build/native/.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _native_module() -> ModuleType:
    """hostring/native.py on its own: importing the hostring package would refuse the stale build this mends."""
    spec = importlib.util.spec_from_file_location("_hostring_native", ROOT / "hostring" / "native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_native = _native_module()
GROUP: str = _native.GROUP
MODULES: tuple[str, ...] = _native.MODULES
extension_of = _native.extension_of

BUILD = ROOT / "build" / "native"
_SETUP = """\
from setuptools import setup
from mypyc.build import mypycify

setup(
    name="hostring-native",
    ext_modules=mypycify({modules!r}, group_name={group!r}, target_dir={target!r}, opt_level={opt!r}),
    script_args=["build_ext", "--inplace", "--build-temp", {temp!r}],
)
"""


def build(opt_level: str = "3") -> int:
    """Compile MODULES at the C compiler's `opt_level`; their extension modules land beside the sources."""
    try:
        import mypyc  # noqa: F401
    except ImportError:
        print("scripts/native.py: mypyc comes with mypy: pip install -e '.[test]'", file=sys.stderr)
        return 2
    clean(quiet=True)  # exactly MODULES compiled, whatever an earlier build left
    BUILD.mkdir(parents=True, exist_ok=True)
    setup = BUILD / "setup.py"
    setup.write_text(
        _SETUP.format(
            modules=list(MODULES), group=GROUP, target=str(BUILD / "c"), temp=str(BUILD / "temp"), opt=opt_level
        )
    )
    done = subprocess.run([sys.executable, str(setup)], cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(done.stdout[-6000:], done.stderr[-6000:], sep="\n", file=sys.stderr)
        return done.returncode
    for module in MODULES:
        extension = extension_of(ROOT / module)
        if extension is not None:
            extension.touch()  # newer than its source, whatever the clock said while it compiled
    print(f"compiled {len(MODULES)} modules (python scripts/native.py clean removes them)")
    return 0


def _compiled_files() -> list[Path]:
    """Every extension module in the packages MODULES come from (they have no others): those built from MODULES, the
    shared library, and any left by a build of a longer list."""
    packages = sorted({ROOT / Path(m).parts[0] for m in MODULES})
    found = {p for package in packages for suffix in EXTENSION_SUFFIXES for p in package.rglob(f"*{suffix}")}
    return sorted(found)


def clean(*, quiet: bool = False) -> int:
    """Remove the compiled modules and the shared library; the sources run again."""
    files = _compiled_files()
    for path in files:
        path.unlink(missing_ok=True)
    shutil.rmtree(BUILD, ignore_errors=True)
    if not quiet:
        print(f"removed {len(files)} compiled files")
    return 0


def status() -> int:
    compiled = [m for m in MODULES if extension_of(ROOT / m) is not None]
    print(f"{len(compiled)} of {len(MODULES)} modules compiled")
    for module in MODULES:
        print(f"  {'compiled ' if module in compiled else 'source   '} {module}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("build", "clean", "status"))
    parser.add_argument(
        "--opt-level",
        choices=("0", "1", "2", "3"),
        default="3",
        help="build: the C compiler's optimisation level (default 3; 0 builds in about half the time)",
    )
    args = parser.parse_args()
    if args.action == "build":
        return build(args.opt_level)
    return {"clean": clean, "status": status}[args.action]()


if __name__ == "__main__":
    sys.exit(main())
