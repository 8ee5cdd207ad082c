"""How a failed command ends: one line on stderr naming the thing and the fix, and the documented exit code.

Usage errors (exit 2) are raised as `UsageError` before anything starts; an unreachable or failing dependency
(Redis, a coordinator, a node, a port in use) is a `DependencyError` (exit 1). Anything else unexpected is one
line too, with the traceback only under `--log-level DEBUG`. A closed pipe on stdout (`hostring report | head`)
ends quietly.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Callable

import grpc

from hostring.security import SecurityConfigError
from hostring_cli.args import EXIT_ERROR, EXIT_OK, EXIT_STOPPED, EXIT_USAGE, UsageError


class DependencyError(Exception):
    """Something the command needs is unreachable or failed (Redis, the coordinator, a node): exit 1."""


def rpc_failure(e: grpc.RpcError, what: str, address: str, flag: str) -> DependencyError:
    """A failed call to `what` at `address`, in words an operator can act on."""
    code, details = getattr(e, "code", None), getattr(e, "details", None)
    status = code() if callable(code) else None
    text = details() if callable(details) else str(e)
    if status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return DependencyError(f"cannot reach the {what} at {address} ({status.name}: {text}); is it running? ({flag})")
    if status is grpc.StatusCode.UNIMPLEMENTED:
        other = "--node" if what == "coordinator" else "--coordinator"
        return DependencyError(
            f"{address} answers, but it is not a {what} (if it is the other kind, give {other} {address})"
        )
    name = status.name if status is not None else "RPC failed"
    return DependencyError(f"the {what} at {address} refused the call: {name}: {text}")


def redis_errors() -> tuple[type[Exception], ...]:
    """What to catch as a Redis failure: redis.RedisError once redis is imported, else nothing (a process that never
    imported redis cannot raise its errors). The CLI imports redis only where it uses it: importing it is 0.1-0.3 s
    of every `hostring` process's start, a crawl's node and worker included."""
    module = sys.modules.get("redis")
    return (module.RedisError,) if module is not None else ()


def redis_failure(e: Exception, url: str, flag: str) -> DependencyError:
    return DependencyError(f"cannot use Redis at {url}: {e}; start Redis or give the right {flag} URL")


def check_redis_url(url: str, flag: str) -> None:
    """A usage error for a Redis URL redis-py cannot parse (no scheme, a port that is no port), before any connect."""
    from redis.connection import parse_url

    try:
        parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as e:
        raise UsageError(f"{flag} {url}: {e}") from None


def run(func: Callable[[], int], *, debug: Callable[[], bool]) -> int:
    """Run a command; map what it raises to one line and an exit code (`debug()`: let a traceback through)."""
    try:
        return func()
    except UsageError as e:
        return _fail(str(e), EXIT_USAGE)
    except SecurityConfigError as e:
        return _fail(str(e), EXIT_USAGE)
    except DependencyError as e:
        return _fail(str(e), EXIT_ERROR)
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        return _fail("stopped", EXIT_STOPPED)
    except grpc.RpcError as e:
        code, details = getattr(e, "code", None), getattr(e, "details", None)
        if callable(code) and callable(details):
            return _fail(f"{code().name}: {details()}", EXIT_ERROR)
        return _fail(f"RPC failed: {e}", EXIT_ERROR)
    except redis_errors() as e:
        return _fail(f"Redis: {e}; is it running, and is the URL right?", EXIT_ERROR)
    except OSError as e:
        if debug():
            raise
        if e.errno == errno.EADDRINUSE:
            return _fail(f"address already in use ({e}); pick another port", EXIT_ERROR)
        return _fail(f"{e}", EXIT_ERROR)
    except Exception as e:
        if debug():
            raise
        return _fail(f"unexpected error: {type(e).__name__}: {e} (run with --log-level DEBUG for the traceback)", 1)


def _fail(message: str, code: int) -> int:
    with contextlib.suppress(OSError):
        print(f"hostring: {message}", file=sys.stderr, flush=True)
    return code


def _quiet_stdout() -> None:
    """After EPIPE on stdout, point it at /dev/null so that the interpreter's final flush stays quiet."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
