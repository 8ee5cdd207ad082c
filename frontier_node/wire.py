"""The Frontier service's method handlers: requests that cannot be decoded are answered, not crashed on.

gRPC's generated registration decodes each request with `FromString`; bytes that are not the message make it
raise inside the server, which answers INTERNAL and logs a traceback for every such call. Here each method's
deserializer never raises: it returns UNDECODABLE, and the handler answers INVALID_ARGUMENT naming the message,
with one warning line per method per minute (counting the ones it did not log). The handlers are built from the
service descriptor, so a method added to the proto is registered the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import grpc
from google.protobuf.message import DecodeError

from hostring.v1 import frontier_pb2 as pb

log = logging.getLogger("hostring.node")

SERVICE: Final = pb.DESCRIPTOR.services_by_name["Frontier"]
WARN_EVERY_S: Final = 60.0


class _Undecodable:
    """The request stand-in for bytes that are not the method's message."""

    def __repr__(self) -> str:
        return "UNDECODABLE"


UNDECODABLE: Final = _Undecodable()


class UndecodableRequest(ValueError):
    """A message of a client stream that is not the method's message (the stream ends INVALID_ARGUMENT)."""


def _deserializer(cls: Any) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError:
            return UNDECODABLE

    return decode


class DecodeWarnings:
    """At most one warning line per method per interval, with the count of undecodable requests since the last."""

    def __init__(self, every_s: float = WARN_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def note(self, method: str) -> None:
        now = self.clock()
        count = self._unlogged.get(method, 0) + 1
        last = self._last.get(method)
        if last is not None and now - last < self.every_s:
            self._unlogged[method] = count
            return
        self._last[method] = now
        self._unlogged[method] = 0
        log.warning(
            "%d undecodable %s request(s) answered INVALID_ARGUMENT%s",
            count,
            method,
            " since the last such line" if last is not None else "",
        )


def handlers(servicer: object, warnings: DecodeWarnings) -> grpc.GenericRpcHandler[Any, Any]:
    """Method handlers for every RPC of the Frontier service, calling `servicer`'s coroutine of the same name."""
    table: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in SERVICE.methods:
        request_cls = getattr(pb, method.input_type.name)
        response_cls = getattr(pb, method.output_type.name)
        behaviour = getattr(servicer, method.name)
        expected = method.input_type.full_name
        if method.client_streaming and method.server_streaming:
            table[method.name] = grpc.stream_stream_rpc_method_handler(
                _bidi(method.name, expected, behaviour, warnings),
                request_deserializer=_deserializer(request_cls),
                response_serializer=response_cls.SerializeToString,
            )
        elif method.server_streaming:
            table[method.name] = grpc.unary_stream_rpc_method_handler(
                _streaming(method.name, expected, behaviour, warnings),
                request_deserializer=_deserializer(request_cls),
                response_serializer=response_cls.SerializeToString,
            )
        else:
            table[method.name] = grpc.unary_unary_rpc_method_handler(
                _unary(method.name, expected, behaviour, warnings),
                request_deserializer=_deserializer(request_cls),
                response_serializer=response_cls.SerializeToString,
            )
    return grpc.method_handlers_generic_handler(SERVICE.full_name, table)


Context = Any  # grpc.aio.ServicerContext[Any, Any]


def _unary(
    name: str, expected: str, behaviour: Callable[[Any, Context], Awaitable[Any]], warnings: DecodeWarnings
) -> Callable[[Any, Context], Awaitable[Any]]:
    async def handle(request: Any, context: Context) -> Any:
        if request is UNDECODABLE:
            warnings.note(name)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {expected} message")
        return await behaviour(request, context)

    return handle


def _streaming(
    name: str, expected: str, behaviour: Callable[[Any, Context], AsyncIterator[Any]], warnings: DecodeWarnings
) -> Callable[[Any, Context], AsyncIterator[Any]]:
    async def handle(request: Any, context: Context) -> AsyncIterator[Any]:
        if request is UNDECODABLE:
            warnings.note(name)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {expected} message")
        async for reply in behaviour(request, context):
            yield reply

    return handle


def _bidi(
    name: str,
    expected: str,
    behaviour: Callable[[AsyncIterator[Any], Context], AsyncIterator[Any]],
    warnings: DecodeWarnings,
) -> Callable[[AsyncIterator[Any], Context], AsyncIterator[Any]]:
    async def handle(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
        async def decoded() -> AsyncIterator[Any]:
            async for request in requests:
                if request is UNDECODABLE:
                    warnings.note(name)
                    raise UndecodableRequest(f"a message of the stream is not a valid {expected} message")
                yield request

        async for reply in behaviour(decoded(), context):
            yield reply

    return handle
