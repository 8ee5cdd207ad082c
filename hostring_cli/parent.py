"""A child process that ends with its parent: `hostring crawl`'s private node must not outlive a killed crawl.

The child asks for it itself, first thing (PR_SET_PDEATHSIG), rather than the parent in a `preexec_fn`: that
makes subprocess fork() the parent instead of vfork/posix_spawn, and a fork of a process with gRPC's threads
running can leave the child broken before it execs (seen: an epoll_wait error and no node).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

from hostring_cli.args import EXIT_ERROR, die

_PR_SET_PDEATHSIG = 1


def exit_with_parent(parent_pid: int) -> None:
    """Receive SIGKILL when the parent dies; exit now (1, with a line saying why) if `parent_pid` is no longer the
    parent (it died before, or the PID given is not this process's parent)."""
    with contextlib.suppress(Exception):  # not Linux: the crawl still stops its node; only a SIGKILLed one leaks
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    parent = os.getppid()
    if parent != parent_pid:
        die(
            f"--exit-with-parent {parent_pid}: process {parent_pid} is not this process's parent (PID {parent} "
            "is); it has ended, or give the parent's PID",
            EXIT_ERROR,
        )


def hostring_command(log_format: str) -> list[str]:
    """The start of a `hostring` child's command line: this Python, quiet (warnings and errors only), logging in
    the parent's format."""
    return [sys.executable, "-m", "hostring_cli", "--log-level", "WARNING", "--log-format", log_format]
