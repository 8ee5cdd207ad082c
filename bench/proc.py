"""Child processes of benchmarks and process tests: start them in their own group, stop them politely, then firmly."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

_PORT_LINE = re.compile(r"listening on port (\d+)")


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


class GroupProcess:
    """A subprocess in its own session (process group), output to files in `log_dir`; `stop` signals the group."""

    stop_signal: int = signal.SIGTERM

    def __init__(self, name: str, cmd: list[str], log_dir: Path, *, cwd: Path | None = None) -> None:
        self.name = name
        self.cmd = cmd
        self.out_path, self.err_path = log_dir / f"{name}.stdout", log_dir / f"{name}.stderr"
        self._files: list[IO[bytes]] = [self.out_path.open("wb"), self.err_path.open("wb")]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=self._files[0], stderr=self._files[1], stdin=subprocess.DEVNULL,
            start_new_session=True, env=child_env(),
        )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def port(self, timeout: float) -> int:
        """The port the process announced on stdout ("listening on port N"), waiting a bounded time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = _PORT_LINE.search(self.out_path.read_text(errors="replace"))
            if m is not None:
                return int(m.group(1))
            if not self.running:
                break
            time.sleep(0.03)
        raise RuntimeError(f"{self.name} did not announce its port within {timeout}s:\n{self.log()[-2000:]}")

    def send(self, sig: int) -> None:
        """Send `sig` to the whole process group, if the leader has not been reaped yet."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, sig: int | None = None, timeout: float = 10.0) -> None:
        """Signal the group (stop_signal by default) and reap the leader; SIGKILL if it outlives `timeout`."""
        self.send(self.stop_signal if sig is None else sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.send(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        for f in self._files:
            f.close()
        self._files = []

    def log(self) -> str:
        return self.err_path.read_text(errors="replace")
