"""Real Redis for tests and benchmarks, on loopback: a redis-server of our own, a container, a three-shard Cluster.

`any_redis()` picks, in order of preference: $REDIS_URL; a throwaway testcontainers container when a Docker
engine answers; a `redis-server` started here on a free port. When none is available it raises `NoRedis`
naming all three. `RedisServer` and `RedisClusterServers` start servers of our own (no persistence) and stop
them by their own handles. The pytest fixtures built on these live in tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

import redis

__all__ = [
    "NoRedis",
    "RedisClusterServers",
    "RedisServer",
    "any_redis",
    "docker_redis",
    "free_port",
    "start_redis_server",
    "stop_redis_server",
]

START_TIMEOUT_S = 10.0
DOCKER_PING_TIMEOUT_S = 2


class NoRedis(RuntimeError):
    """No Redis could be had; the message says what was tried."""


def free_port(*, bus: bool = False) -> int:
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
    deadline = time.monotonic() + START_TIMEOUT_S
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
    raise RuntimeError(f"redis-server on port {port} did not answer PING within {START_TIMEOUT_S}s")


def start_redis_server(directory: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    """One redis-server on 127.0.0.1:`port`, no persistence, working (and logging) in `directory`.

    It runs in its own session, so a Ctrl-C meant for the caller does not stop it before the caller does.
    """
    log = directory / f"redis-{port}.log"
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(directory), "--logfile", str(log), *extra]  # fmt: skip
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    try:
        _wait_ping(port, proc, log)
    except BaseException:
        stop_redis_server(proc)
        raise
    return proc


def stop_redis_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server started here (by its own handle), killing it if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class RedisServer:
    """A redis-server of our own on a free loopback port (or `port`), no persistence, in `directory`."""

    def __init__(self, directory: Path, *extra: str, port: int | None = None) -> None:
        self.port = free_port() if port is None else port
        self.proc = start_redis_server(directory, self.port, *extra)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def flush(self) -> None:
        """FLUSHALL: every database of this server emptied."""
        client = redis.Redis(host="127.0.0.1", port=self.port)
        try:
            client.flushall()
        finally:
            client.close()

    def stop(self) -> None:
        stop_redis_server(self.proc)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class RedisClusterServers:
    """Three redis-server primaries on loopback, in `directory`, joined into one Redis Cluster (no replicas)."""

    def __init__(self, directory: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            self.ports: list[int] = []
            for _ in range(3):
                port = free_port(bus=True)
                while port in self.ports:
                    port = free_port(bus=True)
                self.ports.append(port)
            for port in self.ports:
                self.procs.append(start_redis_server(
                    directory, port, "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                    "--cluster-node-timeout", "5000",
                ))  # fmt: skip
            create = subprocess.run(
                ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports), "--cluster-replicas",
                 "0", "--cluster-yes"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if create.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout[-1500:]} {create.stderr[-500:]}")
            self._wait_cluster_ok()
        except BaseException:
            self.stop()
            raise
        self.url = f"redis://127.0.0.1:{self.ports[0]}/0"
        """The URL of one node; a Cluster client finds the others."""

    def _wait_cluster_ok(self) -> None:
        """Wait until every node reports cluster_state:ok and knows all three primaries."""
        deadline = time.monotonic() + 30.0
        pending = list(self.ports)
        while pending and time.monotonic() < deadline:
            port = pending[0]
            client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1.0)
            try:
                info = client.cluster("info")
                state = info.get("cluster_state") if isinstance(info, dict) else None
                known = int(info.get("cluster_known_nodes", 0)) if isinstance(info, dict) else 0
                if state == "ok" and known == len(self.ports):
                    pending.pop(0)
                    continue
            finally:
                client.close()
            time.sleep(0.05)
        if pending:
            raise RuntimeError(f"Redis Cluster on ports {self.ports} did not reach cluster_state:ok")

    def stop(self) -> None:
        for proc in self.procs:
            stop_redis_server(proc)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


@contextlib.contextmanager
def docker_redis() -> Iterator[str]:
    """The URL of a testcontainers Redis, if a Docker engine answers a ping quickly; raises with the reason
    otherwise (the docker and testcontainers packages are imported only here)."""
    import docker  # type: ignore[import-untyped]

    try:
        from testcontainers.community.redis import RedisContainer
    except ImportError:
        from testcontainers.redis import RedisContainer

    engine = docker.from_env(timeout=DOCKER_PING_TIMEOUT_S)
    try:
        engine.ping()
    finally:
        engine.close()
    with RedisContainer("redis:7-alpine") as container:
        host = container.get_container_host_ip()
        port = container.get_exposed_port(6379)
        yield f"redis://{host}:{port}/0"


@contextlib.contextmanager
def any_redis() -> Iterator[str]:
    """A single Redis: $REDIS_URL, else a container, else a redis-server of our own (stopped afterwards).

    Raises NoRedis, naming what was tried, when there is none.
    """
    env = os.environ.get("REDIS_URL")
    if env:
        yield env
        return
    tried: list[str] = ["REDIS_URL: not set"]
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(docker_redis())
        except Exception as exc:  # any failure only means "no Docker": reported
            tried.append(f"testcontainers: no Docker engine answered ({type(exc).__name__}: {exc})"[:300])
        else:
            yield url
            return
    if shutil.which("redis-server") is None:
        tried.append("redis-server: not found on PATH")
        raise NoRedis("no Redis for the tests; tried " + "; ".join(tried))
    with tempfile.TemporaryDirectory(prefix="hostring-redis-") as tmp:
        try:
            server = RedisServer(Path(tmp))
        except Exception as exc:  # reported in the NoRedis reason
            tried.append(f"redis-server: {exc}")
            raise NoRedis("no Redis for the tests; tried " + "; ".join(tried)) from None
        with server:
            yield server.url
