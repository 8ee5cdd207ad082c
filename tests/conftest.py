"""Fixtures shared by the test modules: real Redis servers and the hostring processes a test starts.

Redis. `redis_url` is, in order of preference: $REDIS_URL; a throwaway testcontainers container when a Docker
engine answers; a `redis-server` started here (hostring_testing.redis_server). `redis_cluster_url` always starts
its own three primaries and joins them with `redis-cli --cluster create`. Both are started once per session.
`srv` is a redis-server of one test's own, for tests that pause, kill or reconfigure it.
Tests get a fresh key namespace each (`redis_namespace`), whose keys are deleted afterwards, so a shared server
given by $REDIS_URL is never flushed.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import settings
from redis.cluster import RedisCluster

from hostring_testing.crawls import CrawlProcess
from hostring_testing.redis_server import NoRedis, RedisClusterServers, RedisServer, any_redis

# Hypothesis's per-example deadline is a timing assertion: on a loaded machine it fails tests whose behaviour is
# right. Examples are still bounded by each test's own max_examples and pytest-timeout.
settings.register_profile("hostring", deadline=None)
settings.load_profile("hostring")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the tests marked `long(seconds)` first, longest first, the rest after them in their order. The suite is
    dispatched one test at a time as workers free up (`--dist loadgroup`), so a test of several minutes collected
    halfway would start late and run alone at the end; started first, it runs beside the rest."""

    def seconds(item: pytest.Item) -> float:
        mark = item.get_closest_marker("long")
        return float(mark.args[0]) if mark is not None and mark.args else 0.0

    items.sort(key=lambda item: -seconds(item))


# ============================================================================================== Redis


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a single Redis for this session: $REDIS_URL, else a container, else a redis-server of our own."""
    try:
        with any_redis() as url:
            yield url
    except NoRedis as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """URL of one node of a three-primary Redis Cluster on loopback, started for this session."""
    missing = [tool for tool in ("redis-server", "redis-cli") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"no Redis Cluster for the tests: {' and '.join(missing)} not found on PATH")
    with tempfile.TemporaryDirectory(prefix="hostring-cluster-") as tmp, RedisClusterServers(Path(tmp)) as cluster:
        yield cluster.url


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own: CLIENT PAUSE, CLIENT KILL and CONFIG SET touch nobody else."""
    with RedisServer(tmp_path) as server:
        yield server


@pytest.fixture
def redis_namespace(request: pytest.FixtureRequest) -> str:
    """A key namespace unique to one test; names that extend it (`ns + "-copy"`) are cleaned up with it."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name[:40])
    return f"t-{name}-{uuid.uuid4().hex[:8]}"


def _delete_namespace(client: redis.Redis | RedisCluster, namespace: str) -> None:
    """Delete the keys of a test's namespace and of namespaces it derived by appending to the name.

    One key at a time: a Cluster spreads them over slots.
    """
    pattern = "".join("\\" + c if c in "*?[]\\" else c for c in namespace) + "*"
    for key in list(client.scan_iter(match=pattern, count=1000)):
        client.delete(key)


@pytest.fixture
def redis_client(redis_url: str, redis_namespace: str) -> Iterator[redis.Redis]:
    """A client of the single Redis; the test's namespace is deleted afterwards."""
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        _delete_namespace(client, redis_namespace)
        client.close()


@pytest.fixture
def redis_cluster_client(redis_cluster_url: str, redis_namespace: str) -> Iterator[RedisCluster]:
    """A Cluster client of the three-shard Cluster; the test's namespace is deleted afterwards."""
    client = RedisCluster.from_url(redis_cluster_url)
    try:
        yield client
    finally:
        _delete_namespace(client, redis_namespace)
        client.close()


@pytest.fixture
def empty_redis(redis_url: str) -> Iterator[str]:
    """The URL of a Redis database (1..15 of the session's server) that holds no key when the test starts.

    Processes started by a test write the fixed namespace "hostring", so two tests in one database would adopt
    each other's domains (local webs reuse the same 127.0.0.N hosts). Its "hostring:*" keys are deleted after.
    """
    base = redis_url.rsplit("/", 1)[0] if re.search(r"/\d+$", redis_url) else redis_url.rstrip("/")
    url = ""
    for db in range(1, 16):
        client = redis.Redis.from_url(f"{base}/{db}")
        try:
            if client.dbsize() == 0:
                url = f"{base}/{db}"
                break
        except redis.ResponseError:  # fewer databases configured
            break
        finally:
            client.close()
    if not url:
        pytest.skip(f"no empty Redis database among 1..15 of {redis_url}")
    try:
        yield url
    finally:
        client = redis.Redis.from_url(url)
        try:
            for key in list(client.scan_iter(match="hostring:*", count=1000)):
                client.delete(key)
        finally:
            client.close()


# ============================================================================================== processes


@pytest.fixture
def processes() -> Iterator[list[CrawlProcess]]:
    """Every process a test appends here is killed (with its process group) at teardown."""
    started: list[CrawlProcess] = []
    yield started
    for proc in started:
        proc.kill()
