"""The calling thread's Python name given to the OS thread too, so `top -H`, `ps -L` and /proc tell them apart.

A node is one process whose threads share the GIL: which of them spends the CPU (the core thread, the gRPC event
loop, a store's writer) is the first question about its speed. Python names its threads for itself only; Linux
keeps a 15-byte name per thread in /proc/self/task/<id>/comm, which the thread may write. Elsewhere, or where
/proc is not writable, nothing happens.
"""

from __future__ import annotations

import threading
from typing import Final

COMM_BYTES: Final = 15
"""Longest thread name Linux keeps (16 bytes with the terminating NUL); longer names are cut."""


def name_os_thread() -> None:
    """Give the calling thread's Python name (cut to COMM_BYTES bytes of UTF-8) to its OS thread, where possible."""
    name = threading.current_thread().name.encode()[:COMM_BYTES].decode(errors="ignore")
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write(name)
    except OSError:
        pass
