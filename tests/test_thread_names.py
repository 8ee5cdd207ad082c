"""OS thread names: a hostring thread's Python name is what top -H, ps -L and /proc show for it."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from hostring.thread_names import COMM_BYTES, name_os_thread
from hostring_testing.crawls import CrawlProcess, serve, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names in /proc are Linux's")


def _os_name_of(python_name: str) -> str:
    """Run name_os_thread on a thread called `python_name`; what /proc says the OS thread is called."""
    seen: list[str] = []

    def run() -> None:
        name_os_thread()
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().rstrip("\n"))

    thread = threading.Thread(target=run, name=python_name)
    thread.start()
    thread.join(10)
    return seen[0]


def test_a_thread_is_known_to_the_os_by_its_python_name() -> None:
    assert _os_name_of("node-loop") == "node-loop"


def test_a_long_name_is_cut_to_what_linux_keeps() -> None:
    assert _os_name_of("checkpoint:frontier.sqlite3") == "checkpoint:frontier.sqlite3"[:COMM_BYTES]


def test_a_name_cut_inside_a_character_keeps_whole_characters() -> None:
    name = "abcdef" + "é" * 10  # 6 + 20 bytes: byte 15 is the first half of the fifth "é", which goes
    assert _os_name_of(name) == "abcdef" + "é" * 4


def test_a_thread_proc_does_not_list_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threading, "get_native_id", lambda: 2**31 - 1)  # no such task: the open fails, quietly
    name_os_thread()


def test_a_node_process_shows_its_threads_by_name(tmp_path: Path, processes: list[CrawlProcess]) -> None:
    """`top -H` on a node tells its core thread from its gRPC loop and its store's checkpointer."""
    store = tmp_path / "n.sqlite3"
    node, _ = serve(["node", "--store", f"sqlite:///{store}", "--listen", "127.0.0.1:0"], tmp_path, "node")
    processes.append(node)

    def names() -> set[str]:
        return {(task / "comm").read_text().strip() for task in Path(f"/proc/{node.pid}/task").iterdir()}

    wait_until(lambda: {"core", "node-loop", "checkpoint:n.sq"} <= names(), 10, f"named threads (now {names()})")
