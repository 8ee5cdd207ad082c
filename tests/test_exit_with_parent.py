"""`hostring node --exit-with-parent PID`: the node `hostring crawl` starts ends when the crawl is SIGKILLed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

_PARENT = textwrap.dedent(
    """
    import os, subprocess, sys
    node = subprocess.Popen(
        [sys.executable, "-m", "hostring_cli", "node", "--store", "memory://", "--listen", "127.0.0.1:0",
         "--exit-with-parent", str(os.getpid())],
        stdout=subprocess.PIPE, text=True,
    )
    line = node.stdout.readline()
    print(node.pid, "listening" in line, flush=True)
    node.stdout.close()
    import time
    time.sleep(120)
    """
)


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(60)
def test_the_node_ends_when_its_parent_is_sigkilled() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    node_pid = 0
    try:
        assert parent.stdout is not None
        pid_text, listening = parent.stdout.readline().split()
        node_pid = int(pid_text)
        assert listening == "True", "the node did not start"
        assert not _gone(node_pid, 0.5), "the node ended while its parent lived"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        # the node is the dead parent's child, reparented to init, which reaps it once SIGKILL lands
        assert _gone(node_pid, 20), "the node outlived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait()
        if node_pid:
            with contextlib.suppress(ProcessLookupError):  # a node that outlived the test: not left running
                os.kill(node_pid, signal.SIGKILL)


def test_a_node_whose_parent_is_already_gone_exits_at_once() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hostring_cli", "node", "--store", "memory://", "--listen", "127.0.0.1:0",
         "--exit-with-parent", "1"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 1 and "listening" not in proc.stdout
