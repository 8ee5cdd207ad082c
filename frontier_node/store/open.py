"""Pick and open a store backend from a URL, so configuration names a store by one string.

Accepted URLs:

- `sqlite:///path/to/node.sqlite3`: an SQLite file. Everything after the three slashes is the path, so
  `sqlite:///data/node.sqlite3` is *relative* (`data/node.sqlite3`) and `sqlite:////var/lib/node.sqlite3`
  (four slashes) is absolute, as in SQLAlchemy. `~` is expanded. Missing parent directories are created.
- `memory://`: a MemoryStore (nothing durable; tests and simulations).
- `redis://...` and `rediss://...` are not opened here: a node on Redis runs in a cluster (`hostring node
  --coordinator ADDR --store redis://HOST:PORT/DB`), where the node opens its RedisStore with its node id and
  the ring's epoch, which fences its writes (frontier_node.server.start_node). open_store says so.
"""

from __future__ import annotations

from pathlib import Path

from frontier_node.core.ports import Store
from frontier_node.store.memory import MemoryStore
from frontier_node.store.sqlite import SqliteStore


def sqlite_path(url: str) -> Path:
    """The file path named by a `sqlite:///...` URL (ValueError if the URL names none)."""
    if not url.startswith("sqlite:///"):
        raise ValueError(f"not a sqlite URL (expected sqlite:///path): {url!r}")
    raw = url[len("sqlite:///") :]
    if not raw or raw.endswith("/"):
        raise ValueError(f"sqlite URL names no file: {url!r} (expected sqlite:///path/to/node.sqlite3)")
    if "?" in raw or "#" in raw:
        raise ValueError(f"sqlite URL takes no query or fragment: {url!r}")
    return Path(raw).expanduser()


def open_store(url: str, *, batch_rows: int = 0) -> Store:
    """Open the store a URL names; ValueError for an unknown scheme or a malformed URL."""
    if url.startswith("sqlite:"):
        if not url.startswith("sqlite:///"):
            raise ValueError(f"malformed sqlite URL {url!r}: use sqlite:///relative/path or sqlite:////absolute/path")
        path = sqlite_path(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        return SqliteStore(path, batch_rows=batch_rows)
    if url.startswith("memory:"):
        if url.rstrip("/") != "memory:":
            raise ValueError(f"memory URL takes no path or options: {url!r} (use memory://)")
        return MemoryStore()
    if url.startswith(("redis://", "rediss://")):
        raise ValueError(
            "a node on Redis runs in a cluster: add --coordinator ADDR (its writes are fenced by the ring's epoch; "
            "a node on its own keeps its state in sqlite:///PATH)"
        )
    raise ValueError(
        f"unsupported store URL {url!r}: accepted schemes are sqlite:///path and memory:// "
        "(redis://HOST:PORT/DB for a node in a cluster)"
    )
