"""Real Redis processes for tests: a single server and a three-shard Cluster, on loopback, started once per session.

`redis_url` is, in order of preference: $REDIS_URL; a throwaway testcontainers container when a Docker engine
answers; a `redis-server` this fixture starts itself. `redis_cluster_url` always starts its own three primaries
and joins them with `redis-cli --cluster create`. Tests get a fresh key namespace each (`redis_namespace`),
whose keys are deleted afterwards, so a shared server given by $REDIS_URL is never flushed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

_START_TIMEOUT_S = 10.0
_DOCKER_PING_TIMEOUT_S = 2


def _free_port(*, bus: bool = False) -> int:
    """A loopback TCP port free now; with `bus`, port + 10000 (the Cluster bus) is free as well."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not bus:
            return port
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port found")


def _wait_ping(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until the server on `port` answers PING; fail with its log if it exits or stays silent."""
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2, socket_timeout=0.5)
    deadline = time.monotonic() + _START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {port} exited ({proc.returncode}): {log.read_text()[-2000:]}")
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                if client.ping():
                    return
            time.sleep(0.02)
    finally:
        client.close()
    raise RuntimeError(f"redis-server on port {port} did not answer PING within {_START_TIMEOUT_S}s")


def _start_server(directory: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    """One redis-server on 127.0.0.1:`port`, no persistence, working in `directory`."""
    log = directory / f"redis-{port}.log"
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(directory), "--logfile", str(log), *extra]  # fmt: skip
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ping(port, proc, log)
    except BaseException:
        _stop(proc)
        raise
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server this module started (by its own handle), killing it if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _docker_redis() -> Generator[str, None, None]:
    """A testcontainers Redis, if a Docker engine answers a ping quickly; raises with the reason otherwise."""
    import docker  # type: ignore[import-untyped]

    try:
        from testcontainers.community.redis import RedisContainer
    except ImportError:
        from testcontainers.redis import RedisContainer

    engine = docker.from_env(timeout=_DOCKER_PING_TIMEOUT_S)
    try:
        engine.ping()
    finally:
        engine.close()
    with RedisContainer("redis:7-alpine") as container:
        host = container.get_container_host_ip()
        port = container.get_exposed_port(6379)
        yield f"redis://{host}:{port}/0"


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a single Redis for this session: $REDIS_URL, else a container, else a redis-server of our own."""
    env = os.environ.get("REDIS_URL")
    if env:
        yield env
        return
    tried: list[str] = ["REDIS_URL: not set"]
    container = _docker_redis()
    try:
        url = next(container)
    except Exception as exc:  # any failure only means "no Docker": reported
        tried.append(f"testcontainers: no Docker engine answered ({type(exc).__name__}: {exc})"[:300])
    else:
        try:
            yield url
        finally:
            container.close()
        return
    if shutil.which("redis-server") is None:
        tried.append("redis-server: not found on PATH")
        pytest.skip("no Redis for the tests; tried " + "; ".join(tried))
    with tempfile.TemporaryDirectory(prefix="hostring-redis-") as tmp:
        port = _free_port()
        try:
            proc = _start_server(Path(tmp), port)
        except Exception as exc:  # reported in the skip reason
            tried.append(f"redis-server: {exc}")
            pytest.skip("no Redis for the tests; tried " + "; ".join(tried))
        try:
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            _stop(proc)


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """URL of one node of a three-primary Redis Cluster on loopback, started for this session."""
    missing = [tool for tool in ("redis-server", "redis-cli") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"no Redis Cluster for the tests: {' and '.join(missing)} not found on PATH")
    with tempfile.TemporaryDirectory(prefix="hostring-cluster-") as tmp:
        procs: list[subprocess.Popen[bytes]] = []
        try:
            ports = []
            for _ in range(3):
                port = _free_port(bus=True)
                while port in ports:
                    port = _free_port(bus=True)
                ports.append(port)
            for port in ports:
                procs.append(_start_server(
                    Path(tmp), port, "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                    "--cluster-node-timeout", "5000",
                ))  # fmt: skip
            create = subprocess.run(
                ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports), "--cluster-replicas", "0",
                 "--cluster-yes"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if create.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout[-1500:]} {create.stderr[-500:]}")
            _wait_cluster_ok(ports)
            yield f"redis://127.0.0.1:{ports[0]}/0"
        finally:
            for proc in procs:
                _stop(proc)


def _wait_cluster_ok(ports: list[int]) -> None:
    """Wait until every node reports cluster_state:ok and knows all three primaries."""
    deadline = time.monotonic() + 30.0
    pending = list(ports)
    while pending and time.monotonic() < deadline:
        port = pending[0]
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1.0)
        try:
            info = client.cluster("info")
            state = info.get("cluster_state") if isinstance(info, dict) else None
            known = int(info.get("cluster_known_nodes", 0)) if isinstance(info, dict) else 0
            if state == "ok" and known == len(ports):
                pending.pop(0)
                continue
        finally:
            client.close()
        time.sleep(0.05)
    if pending:
        raise RuntimeError(f"Redis Cluster on ports {ports} did not reach cluster_state:ok")


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
