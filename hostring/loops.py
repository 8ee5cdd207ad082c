"""An asyncio event loop on a thread of its own, for servers whose callers are plain threads.

The node and the coordinator serve grpc.aio on such a loop while their start, stop and signal handling stay
blocking calls; both start the loop and run coroutines on it from other threads the same way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from hostring.thread_names import name_os_thread

T = TypeVar("T")


def start_loop(name: str) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """A new event loop running forever on a daemon thread called `name`."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=_run_forever, args=(loop,), name=name, daemon=True)
    thread.start()
    return loop, thread


def run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], timeout: float) -> T:
    """Run a coroutine on `loop` from another thread and wait at most `timeout` seconds for its result."""
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return fut.result(timeout)
    except concurrent.futures.TimeoutError:
        fut.cancel()
        raise


def _run_forever(loop: asyncio.AbstractEventLoop) -> None:
    name_os_thread()
    asyncio.set_event_loop(loop)
    loop.run_forever()
