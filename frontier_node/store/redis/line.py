"""The line a Redis store's flushes travel on (and a body index's claims): one connection, one call out at a time,
in the order they were begun.

The thread that begins a call (the core thread) sends it itself when none is out and the line's connection is up;
the line's own thread reads the answers and sends the next call queued meanwhile as soon as they are in. When the
core handed every send to another thread, a flush or a registration waited for that thread's turn at the GIL (up to
the interpreter's switch interval, 5 ms) while the core went on with the next batch: a wait on every batch's path,
in front of Redis. Measured in bench.cluster's lease-in-reply phase on one Redis node, the two ways alternating each
second within a run: flushes sent this way, 0-10% more URLs a second (8 runs, 7% on average); flushes and claims,
5-20% (13% on average over 5 runs). A thread of its own doing the sends gained nothing, and letting several
flushes out at once on the wire nothing more.

The line holds a connection from the client's pool between flushes. A flush goes on it only when it answered the
flush before and has nothing to read (no reply nor close waiting: a server that closed it, or restarted); otherwise
the line's thread sends the flush through redis-py's pipeline, which takes a connection from the pool as it checks
and connects it, as every flush went before. A connection that fails under a flush raises that error, as the
pipeline does (its writes may or may not have landed: flight.py buffers them again). A call that raises halts the
line, and `halt()` does so from a `finish` callback: every flush behind is answered NotSent until `resume()` (see
flight.py: no flush behind one that did not land may reach Redis).

A Cluster client has no one connection to hold: calls through it (the body index's claims) run whole on a `Writer`.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from hostring.thread_names import name_os_thread

T = TypeVar("T")

_BROKEN = (RedisConnectionError, RedisTimeoutError, OSError)
"""What checking a held connection meets when the server closed it."""


class NotSent(ConnectionError):
    """A flush was not sent: one begun before it did not land (its writes are buffered again, behind that one's)."""


@dataclass(slots=True)
class _Flush:
    """A flush on the line: its pipeline (commands queued, not executed), what its answers are handed to, its
    future, and whether it was sent on the line's connection."""

    pipe: Any
    finish: Callable[[list[Any]], Any]
    answers: Future[Any] = field(default_factory=Future)
    sent: bool = False
    failed: BaseException | None = None  # what sending it met (part of it may have gone out)


def _not_sent(flush: _Flush) -> None:
    flush.answers.set_exception(NotSent("not sent: a flush begun before it did not land"))


class Line:
    """One connection to a single Redis server and a daemon thread that reads its answers (a daemon: a Redis that
    stopped answering must not hold the node's process at exit). With `halts` false a call that raised answers its
    own future only (the body index's claims: each call stands alone)."""

    def __init__(self, client: Any, name: str, *, halts: bool = True) -> None:
        self._connections = client.connection_pool
        self._halts = halts
        self._conn: Any = None  # held once a flush went through the pipeline; dropped on any failure
        self._lock = threading.Lock()
        self._busy = False  # a flush is out (being sent, or its answers not read yet)
        self._halted = False
        self._waiting: deque[_Flush] = deque()  # begun while another was out: sent by the line's thread, in order
        self._out: queue.SimpleQueue[_Flush | None] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, pipe: Any, finish: Callable[[list[Any]], T]) -> Future[T]:
        """Send `pipe`'s commands behind the flushes out; the future answers `finish(answers)`, the answers as
        `pipe.execute(raise_on_error=False)` gives them, called on the line's thread."""
        flush = _Flush(pipe, finish)
        with self._lock:
            if self._halted:
                _not_sent(flush)
                return flush.answers
            if self._busy:
                self._waiting.append(flush)
                return flush.answers
            self._busy = True
            here = self._conn is not None
        if here:
            self._send(flush)
        self._out.put(flush)
        return flush.answers

    def halt(self) -> None:
        """Answer the flushes behind the one being answered NotSent (called from its `finish`, on the line's
        thread)."""
        self._halted = True

    def resume(self) -> None:
        """Send flushes again (once every flush answered NotSent is accounted for)."""
        with self._lock:
            self._halted = False

    def close(self) -> None:
        self._out.put(None)

    def _run(self) -> None:
        name_os_thread()
        while (flush := self._out.get()) is not None:
            while flush is not None:
                self._answer(flush)
                with self._lock:
                    dropped: list[_Flush] = []
                    if self._halted:
                        dropped, self._waiting = list(self._waiting), deque()
                    following = self._waiting.popleft() if self._waiting else None
                    self._busy = following is not None
                for behind in dropped:
                    _not_sent(behind)
                flush = following
        self._drop()

    def _answer(self, flush: _Flush) -> None:
        """Send the flush unless it went out, read its answers and answer its future (halting on an error)."""
        try:
            if not flush.sent:
                self._send(flush)
            if flush.failed is not None:
                raise flush.failed
            if flush.sent:
                answers = self._read(flush)
            else:
                answers = flush.pipe.execute(raise_on_error=False)
                self._hold()
            result = flush.finish(answers)
        except BaseException as e:
            self._halted = self._halts
            flush.answers.set_exception(e)
        else:
            flush.answers.set_result(result)

    def _send(self, flush: _Flush) -> None:
        """Write the flush's commands on the held connection if it is fit for it; else leave the flush unsent (the
        line's thread sends it through the pipeline). Never raises: what the write met is kept for `_answer`, on the
        line's thread (the caller must go on to queue the flush there, or the line would stay busy)."""
        conn = self._conn
        if conn is None:
            return
        try:
            if conn.can_read(timeout=0):  # a reply nobody asked for, or the server closed it
                raise RedisConnectionError("the held connection has data waiting")
        except _BROKEN:
            self._drop()
            return
        try:
            conn.send_packed_command(conn.pack_commands([args for args, _ in flush.pipe.command_stack]))
        except BaseException as e:
            self._drop()
            flush.failed = e
            return
        flush.sent = True

    def _read(self, flush: _Flush) -> list[Any]:
        """The answers of a flush sent on the held connection, as the pipeline gives them: an error reply is its
        ResponseError in place. Any other failure drops the connection (replies may be left on it) and raises."""
        conn, pipe = self._conn, flush.pipe
        out: list[Any] = []
        try:
            for args, options in pipe.command_stack:
                try:
                    out.append(pipe.parse_response(conn, args[0], **options))
                except ResponseError as e:
                    out.append(e)
        except BaseException:
            self._drop()
            raise
        return out

    def _hold(self) -> None:
        """Take a connection from the pool for the flushes to come (after one went through the pipeline)."""
        if self._conn is None:
            self._conn = self._connections.get_connection()

    def _drop(self) -> None:
        """Give the held connection back to the pool, closed (the pool reconnects it when it hands it out)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.disconnect()
            self._connections.release(conn)


class Writer:
    """A daemon thread that runs calls to Redis in order, each whole, each answering a Future (a daemon: a Redis that
    stopped answering must not hold the node's process at exit)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, call: Callable[[], T]) -> Future[T]:
        answer: Future[T] = Future()
        self._jobs.put((answer, call))
        return answer

    def close(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        name_os_thread()
        while (job := self._jobs.get()) is not None:
            answer, call = job
            try:
                answer.set_result(call())
            except BaseException as e:
                answer.set_exception(e)
