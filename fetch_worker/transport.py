"""The connect-time SSRF guard under httpx: an httpcore network backend that connects only to policy-checked
addresses, and the httpx transport that puts it under a client.

`PolicyBackend` resolves each hostname itself, checks every resolved address against the `NetworkPolicy` and
connects to the checked IP literal, so DNS rebinding cannot swap the address between check and connect (TLS
still verifies the hostname: httpcore passes `server_hostname` from the request origin). httpx's own
AsyncHTTPTransport takes no network backend, so `PolicyTransport` is a custom transport (httpx's documented
seam) over an httpcore connection pool built with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import select
import socket
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from fetch_worker.netpolicy import NetworkPolicy


@dataclass(slots=True)
class ConnectTrace:
    """Where the fetch in this context last tried to connect: set before each attempt, read after the fetch."""

    remote_ip: str = ""


CONNECT_TRACE: contextvars.ContextVar[ConnectTrace | None] = contextvars.ContextVar(
    "hostring_fetch_trace", default=None
)


class PolicyBackend(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that connects only to policy-checked IP literals.

    Resolution and every connection attempt share the connect timeout. When a
    name has several (all allowed) addresses they are tried in resolver order
    until one accepts. Unix sockets are refused outright.
    """

    def __init__(self, policy: NetworkPolicy, inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self.policy = policy
        self._inner = inner if inner is not None else httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            async with asyncio.timeout(timeout):
                addresses = await self.policy.resolve(host, port)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {host!r} took longer than {timeout}s") from None
        trace = CONNECT_TRACE.get()
        failure: httpcore.ConnectError | None = None
        for address in addresses:
            if trace is not None:
                trace.remote_ip = address
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise httpcore.ConnectTimeout(f"connecting to {host!r} took longer than {timeout}s")
            try:
                stream = await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=remaining,
                    local_address=local_address,
                    socket_options=socket_options,
                )
                return _KnownStream(stream)
            except httpcore.ConnectError as exc:
                failure = exc
        assert failure is not None  # resolve() never returns an empty list
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not reachable through the network policy")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _KnownStream(httpcore.AsyncNetworkStream):
    """A connected stream whose peer address and socket are looked up once, at connect.

    The connection pool asks every idle connection whether its socket is readable (a server that closed it) each
    time it hands out or takes back a connection, and the fetcher asks for the peer address of every response;
    the anyio stream answers each question by building all of its attributes afresh. Everything else is the
    wrapped stream's.
    """

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._socket: socket.socket | None = inner.get_extra_info("socket")
        self._server_addr: Any = inner.get_extra_info("server_addr")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        return _KnownStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "server_addr":
            return self._server_addr
        if info == "socket":
            return self._socket
        if info == "is_readable":
            return _readable(self._socket)
        return self._inner.get_extra_info(info)


def _readable(sock: socket.socket | None) -> bool:
    """Whether reading `sock` would not block (data, or the end of the stream); a closed socket counts as readable,
    as in httpcore (an idle connection whose socket is readable was closed by its server)."""
    fd = sock.fileno() if sock is not None else -1
    if fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


# httpcore's exceptions and the httpx ones a client raises for them (httpx maps them the same way).
_HTTPX_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
)


@contextlib.contextmanager
def _as_httpx_errors() -> Iterator[None]:
    """Re-raise an httpcore exception as the most specific httpx one (the policy's own errors pass as they are)."""
    try:
        yield
    except Exception as exc:
        mapped: type[httpx.TransportError] | None = None
        for source, target in _HTTPX_ERRORS:
            if isinstance(exc, source) and (mapped is None or issubclass(target, mapped)):
                mapped = target
        if mapped is None:
            raise
        raise mapped(str(exc)) from exc


class _ResponseStream(httpx.AsyncByteStream):
    """An httpcore response body as an httpx stream."""

    def __init__(self, stream: AsyncIterable[bytes]) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_errors():
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        aclose = getattr(self._stream, "aclose", None)
        if aclose is not None:
            await aclose()


class PolicyTransport(httpx.AsyncBaseTransport):
    """An httpx transport over an httpcore connection pool whose every connect goes through `PolicyBackend`.

    httpx's own AsyncHTTPTransport takes no network backend, so this is httpx's documented seam for custom
    transports: each request is handed to the pool as an httpcore request, and the response comes back with
    its extensions (the connected address included) and httpcore's errors raised as httpx's.
    """

    def __init__(self, pool: httpcore.AsyncConnectionPool) -> None:
        self._connections = pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not isinstance(request.stream, httpx.AsyncByteStream):
            raise TypeError("PolicyTransport needs an async request body")
        url = request.url
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx_errors():
            response = await self._connections.handle_async_request(core_request)
        if not isinstance(response.stream, AsyncIterable):
            raise TypeError("an async connection pool answered with a sync body")
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._connections.aclose()


def policy_transport(policy: NetworkPolicy, ssl_context: ssl.SSLContext, max_connections: int) -> PolicyTransport:
    """The pool httpx.AsyncHTTPTransport would build (no proxies, HTTP/1.1, no retries), except that every
    connect goes through `policy`."""
    return PolicyTransport(
        httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=max_connections,
            max_keepalive_connections=min(20, max_connections),
            keepalive_expiry=5.0,
            http1=True,
            http2=False,
            retries=0,
            network_backend=PolicyBackend(policy),
        )
    )
