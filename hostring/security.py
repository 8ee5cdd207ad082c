"""Transport security and the admin token, built the same way by every hostring process.

TLS: `TlsConfig` holds PEM bytes read once from `--tls-cert`, `--tls-key` and `--tls-ca`. A server with a
certificate and key speaks TLS; with a CA as well it requires and verifies client certificates (mutual TLS).
A client verifies the server against the CA (the system roots without one) and presents its own certificate
when it has one. With no files at all everything stays plaintext, as before: `INSECURE`.

Admin token: administrative RPCs (pausing a host, changing its policy; joining, heartbeating in or leaving the
ring) need gRPC metadata `authorization: Bearer <token>` when the server has a token, from `$HOSTRING_ADMIN_TOKEN`
or a file.
The check is a server interceptor (sync and asyncio flavours), so the servicers stay unaware of it. A server
without a token leaves those RPCs open: every deployment should set one (the shipped manifests do).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from hostring.limits import grpc_options
from hostring.text import unsendable_at

if TYPE_CHECKING:  # the stubs make these generic; at run time they are plain classes
    _SyncInterceptor = grpc.ServerInterceptor[Any, Any]
    _AioInterceptor = grpc.aio.ServerInterceptor[Any, Any]
    Handler = grpc.RpcMethodHandler[Any, Any]
else:
    _SyncInterceptor = grpc.ServerInterceptor
    _AioInterceptor = grpc.aio.ServerInterceptor
    Handler = grpc.RpcMethodHandler

ADMIN_TOKEN_ENV = "HOSTRING_ADMIN_TOKEN"
"""Environment variable holding the admin token (servers check it, admin clients send it)."""

FRONTIER_ADMIN_METHODS = frozenset(
    {
        "/hostring.v1.Frontier/PauseHost",
        "/hostring.v1.Frontier/SetHostPolicy",
        "/hostring.v1.Frontier/ReleaseLeases",
        "/hostring.v1.Frontier/Reconsider",
        "/hostring.v1.Frontier/Refetch",
    }
)
COORDINATOR_ADMIN_METHODS = frozenset(
    {"/hostring.v1.Coordinator/Register", "/hostring.v1.Coordinator/Heartbeat", "/hostring.v1.Coordinator/Leave"}
)
"""Membership changes and signs of life: with a token set, a Heartbeat without it could keep a dead node's id in
the ring (its domains would stall), so it needs the token as much as Register and Leave do."""
# All of these are unary-unary calls: the refusal handlers below answer that call shape only.

ChannelOptions = Sequence[tuple[str, Any]]


class SecurityConfigError(ValueError):
    """Certificate or token settings that cannot work: a key without a certificate, an unreadable file."""


def _read(path: str | os.PathLike[str] | None, what: str) -> bytes | None:
    if not path:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SecurityConfigError(f"cannot read {what} {path}: {e.strerror}") from e
    if not data.strip():
        raise SecurityConfigError(f"{what} {path} is empty")
    return data


def _pem(path: str | None, what: str) -> bytes | None:
    """A PEM file's bytes; refused here when it holds no PEM block, which gRPC reports only as a failed connection
    or bind ("cannot reach", "could not listen")."""
    data = _read(path, what)
    if data is not None and b"-----BEGIN " not in data:
        raise SecurityConfigError(f"{what} {path} is not a PEM file (no '-----BEGIN ...' line)")
    return data


_PAIRING = "--tls-cert and --tls-key go together: give both or neither"


@dataclass(frozen=True)
class TlsConfig:
    """PEM material for one process; empty means plaintext. Build with `from_args` or `from_files`."""

    cert: bytes | None = None
    key: bytes | None = None
    ca: bytes | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise SecurityConfigError(_PAIRING)

    @classmethod
    def from_files(cls, cert: str | None = None, key: str | None = None, ca: str | None = None) -> TlsConfig:
        """Read the PEM files that are given (None or '' = not given); a lone cert or key is named before either
        is read."""
        if bool(cert) != bool(key):
            raise SecurityConfigError(_PAIRING)
        return cls(_pem(cert, "TLS certificate"), _pem(key, "TLS key"), _pem(ca, "TLS CA bundle"))

    @classmethod
    def from_args(cls, args: object) -> TlsConfig:
        """From parsed `--tls-cert/--tls-key/--tls-ca` flags (attributes missing on `args` count as not given)."""
        return cls.from_files(
            getattr(args, "tls_cert", None), getattr(args, "tls_key", None), getattr(args, "tls_ca", None)
        )

    @property
    def enabled(self) -> bool:
        """Whether connections use TLS at all."""
        return self.cert is not None or self.ca is not None

    @property
    def mutual(self) -> bool:
        """Whether a server built from this config requires client certificates."""
        return self.cert is not None and self.ca is not None

    # ------------------------------------------------------------------ server side

    def server_credentials(self) -> grpc.ServerCredentials:
        """TLS credentials for a server: its certificate, and client verification against the CA if one is given."""
        if self.cert is None or self.key is None:
            raise SecurityConfigError("a TLS server needs --tls-cert and --tls-key (--tls-ca adds client verification)")
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=self.ca is not None
        )

    def add_port(self, server: grpc.Server | grpc.aio.Server, listen: str) -> int:
        """Bind `listen` on `server`, with TLS when configured; the bound port, or OSError naming the address."""
        try:
            if self.enabled:
                port = server.add_secure_port(listen, self.server_credentials())
            else:
                port = server.add_insecure_port(listen)
        except RuntimeError as e:
            raise OSError(f"could not listen on {listen!r}: {e}") from e
        if port == 0:
            raise OSError(f"could not listen on {listen!r}")
        return port

    # ------------------------------------------------------------------ client side

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Credentials for a client: trust the CA (or the system roots), present our certificate if we have one."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    def channel(self, address: str, options: ChannelOptions = ()) -> grpc.Channel:
        """A blocking-API channel to `address`, secure when configured, with the one message limit."""
        if self.enabled:
            return grpc.secure_channel(address, self.channel_credentials(), options=with_limits(options))
        return grpc.insecure_channel(address, options=with_limits(options))

    def aio_channel(self, address: str, options: ChannelOptions = ()) -> grpc.aio.Channel:
        """An asyncio channel to `address`, secure when configured, with the one message limit."""
        if self.enabled:
            return grpc.aio.secure_channel(address, self.channel_credentials(), options=with_limits(options))
        return grpc.aio.insecure_channel(address, options=with_limits(options))


def with_limits(options: ChannelOptions = ()) -> list[tuple[str, Any]]:
    """`options` with hostring's message limits (hostring.limits.grpc_options) in place of any given ones: a channel
    never accepts less than its servers send, nor sends more than they accept."""
    limits = grpc_options()
    names = {name for name, _ in limits}
    return [*limits, *(o for o in options if o[0] not in names)]


INSECURE = TlsConfig()
"""Plaintext everywhere: the default when no certificates are given."""


# ---------------------------------------------------------------------------------------------- admin token


def load_admin_token(path: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The admin token from `path` when given, else from $HOSTRING_ADMIN_TOKEN; None when neither is set.

    Surrounding whitespace (a trailing newline in a mounted Secret) is dropped; an empty value means "no token".
    """
    if path:
        token = (_read(path, "admin token file") or b"").decode("utf-8", errors="replace").strip()
        if not token:
            raise SecurityConfigError(f"admin token file {path} holds no token")
        return _header_safe(token, f"admin token file {path}")
    env = os.environ if environ is None else environ
    return _header_safe(env.get(ADMIN_TOKEN_ENV, "").strip(), f"${ADMIN_TOKEN_ENV}") or None


def _header_safe(token: str, source: str) -> str:
    """The token, if gRPC metadata can carry it (printable ASCII); a client could not send it otherwise."""
    at = unsendable_at(token)
    if at is not None:
        raise SecurityConfigError(
            f"the admin token in {source} has a character gRPC metadata cannot carry at position {at} "
            "(a line break, a control or non-ASCII character); use printable ASCII only"
        )
    return token


def admin_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying `token` (nothing without one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def _refusal(metadata: Sequence[tuple[str, str | bytes]] | None, token: str, method: str) -> str:
    """Why a call to `method` is refused ('' when its metadata carries the right token)."""
    given = ""
    for name, value in metadata or ():
        if name.lower() == "authorization":
            given = value.decode("latin-1") if isinstance(value, bytes) else value
            break
    if not given:
        return (
            f"{method} is an administrative call: send metadata 'authorization: Bearer <token>' with the "
            f"server's admin token (${ADMIN_TOKEN_ENV} or --admin-token-file)"
        )
    scheme, _, presented = given.strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), token.encode()):
        return f"{method}: wrong admin token"
    return ""


def _check(token: str) -> None:
    if not token:
        raise SecurityConfigError("an admin token interceptor needs a non-empty token")


class AdminTokenInterceptor(_SyncInterceptor):
    """Refuses the listed methods with UNAUTHENTICATED unless they carry the admin token (sync grpc.server)."""

    def __init__(self, token: str, methods: Collection[str]) -> None:
        _check(token)
        self._token = token
        self._methods = frozenset(methods)

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Handler | None], details: grpc.HandlerCallDetails
    ) -> Handler | None:
        method: str = details.method
        if method not in self._methods:
            return continuation(details)
        reason = _refusal(details.invocation_metadata, self._token, method)
        if not reason:
            return continuation(details)

        def deny(request: object, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

        return grpc.unary_unary_rpc_method_handler(deny)


class AioAdminTokenInterceptor(_AioInterceptor):
    """The same check for a grpc.aio server (the coordinator)."""

    def __init__(self, token: str, methods: Collection[str]) -> None:
        _check(token)
        self._token = token
        self._methods = frozenset(methods)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        details: grpc.HandlerCallDetails,
    ) -> Handler:
        method: str = details.method
        if method not in self._methods:
            return await continuation(details)
        reason = _refusal(details.invocation_metadata, self._token, method)
        if not reason:
            return await continuation(details)

        async def deny(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

        return grpc.unary_unary_rpc_method_handler(deny)
