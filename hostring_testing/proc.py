"""Child processes of tests and benchmarks: one wrapper for them all.

A child runs in its own session (process group), so stopping it stops everything it started (a crawl and its
node child, say); its stdout and stderr go to files in a log directory, where the "listening on port N" line is
read and where failures are quoted from. Hostring children are started as ``python -m hostring_cli`` from the
repository root, never by importing a service.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Self

__all__ = [
    "PORT_LINE",
    "REPO",
    "STARTUP_TIMEOUT_S",
    "GroupProcess",
    "Proc",
    "child_env",
    "hostring_cmd",
    "log_records",
    "stop_process",
]

REPO = Path(__file__).resolve().parent.parent
"""Where children run: the repository root, so `python -m hostring_cli` imports the code of this tree."""
STARTUP_TIMEOUT_S = 30.0
PORT_LINE = re.compile(r"listening on port (\d+)")


def hostring_cmd(*args: str) -> list[str]:
    """A `hostring` command line run with this interpreter; logs as JSON lines (what a child writes to a file
    anyway: `--log-format auto` is JSON off a terminal)."""
    return [sys.executable, "-m", "hostring_cli", "--log-format", "json", *args]


def stop_process(proc: subprocess.Popen[str] | subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`; close its stdout pipe."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


def child_env() -> dict[str, str]:
    """This environment for a hostring child: unbuffered output, no admin token (test clusters run without)."""
    env = {k: v for k, v in os.environ.items() if k != "HOSTRING_ADMIN_TOKEN"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def log_records(text: str) -> list[tuple[str, str]]:
    """(message, traceback) of every record of a process log, in text or JSON-lines format (`--log-format`)."""
    records: list[tuple[str, str]] = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                records.append((str(rec.get("msg", "")), str(rec.get("exc", ""))))
                continue
        if re.match(r"\d{4}-\d\d-\d\d[ T]", line) or not records:
            records.append((line, ""))
        else:  # a traceback line of the text format belongs to the record before it
            msg, exc = records[-1]
            records[-1] = (msg, f"{exc}\n{line}" if exc else line)
    return records


class GroupProcess:
    """A subprocess in its own session (process group), output to files in `log_dir`; `stop` signals the group.

    It starts at once unless `start=False` (then `start()` starts it). Its environment is `child_env()`, or
    this process's own environment, as it is when the child starts, with `inherit_env`.
    """

    stop_signal: int = signal.SIGTERM
    inherit_env: bool = False

    def __init__(
        self, name: str, cmd: list[str], log_dir: Path, *, cwd: Path | None = None, start: bool = True
    ) -> None:
        self.name = name
        self.cmd = cmd
        self.log_dir = log_dir
        self.cwd = cwd
        self.out_path, self.err_path = log_dir / f"{name}.stdout", log_dir / f"{name}.stderr"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self._files: list[IO[bytes]] = []
        if start:
            self.start()

    def start(self) -> Self:
        """Start the child (once); returns self."""
        if self.proc is not None:
            raise RuntimeError(f"{self.name} already started")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._files = [self.out_path.open("wb"), self.err_path.open("wb")]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.cmd, cwd=self.cwd, stdout=self._files[0], stderr=self._files[1], stdin=subprocess.DEVNULL,
            start_new_session=True, env=None if self.inherit_env else child_env(),
        )  # fmt: skip
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def port(self, timeout: float) -> int:
        """The port the process announced on stdout ("listening on port N"), waiting a bounded time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = PORT_LINE.search(self.stdout())
            if m is not None:
                return int(m.group(1))
            if not self.running:
                break
            time.sleep(0.03)
        raise RuntimeError(f"{self.name} did not announce its port within {timeout}s:\n{self.log()[-2000:]}")

    def send(self, sig: int) -> None:
        """Send `sig` to the whole process group, if the leader has not been reaped yet."""
        if self.running:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, sig: int | None = None, timeout: float = 10.0) -> None:
        """Signal the group (stop_signal by default) and reap the leader; SIGKILL if it outlives `timeout`."""
        if self.proc is None:
            return
        self.send(self.stop_signal if sig is None else sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.send(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        self._close()

    def _close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []

    def stdout(self) -> str:
        return self.out_path.read_text(encoding="utf-8", errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(encoding="utf-8", errors="replace")

    def log(self) -> str:
        """What the process logged (its stderr)."""
        return self.stderr()


class Proc(GroupProcess):
    """One `hostring` child of a test or benchmark harness, run from the repository root.

    Stopped with SIGKILL unless told otherwise; a process that never announces its port fails with its last
    log messages.
    """

    stop_signal = signal.SIGKILL

    def __init__(self, name: str, cmd: list[str], log_dir: Path) -> None:
        super().__init__(name, cmd, log_dir, cwd=REPO)

    def port(self, timeout: float = STARTUP_TIMEOUT_S) -> int:
        try:
            return super().port(timeout)
        except RuntimeError:
            raise AssertionError(f"{self.name} did not announce its port within {timeout}s\n{self.tail()}") from None

    def tail(self, n: int = 12) -> str:
        """The last `n` distinct log messages (repeats counted, tracebacks cut to their last lines)."""
        out = self.stdout()[-300:].strip()
        counted: list[list[Any]] = []
        for msg, exc in log_records(self.log()):
            text = re.sub(r"\d+\.\d+s|:\d{4,5}\b", "", msg)  # so that repeats differing in a time or port merge
            if counted and counted[-1][0] == text:
                counted[-1][2] += 1
            else:
                counted.append([text, msg + ("\n    " + "\n    ".join(exc.splitlines()[-3:]) if exc else ""), 1])
        lines = [f"  {full}" + (f"  (x{k})" if k > 1 else "") for _, full, k in counted[-n:]]
        rc = self.proc.poll() if self.proc is not None else None
        return f"--- {self.name} (pid {self.pid}, rc {rc}); stdout: {out}\n" + "\n".join(lines)
