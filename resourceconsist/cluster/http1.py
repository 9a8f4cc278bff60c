"""A small HTTP/1.1 client on asyncio: the connections of the loop transport
(resourceconsist.cluster.aiokube) to one API server.

``Pool`` keeps at most ``limit`` keep-alive connections to one host, each carrying one request
at a time; ``Connection`` is the asyncio protocol of one of them, which parses the answers as
their bytes arrive (the status line and headers, then a body framed by ``Content-Length`` or
chunked, or read to the connection's end). It sends what the transport sends and nothing else:
requests whose body is in memory, no proxy, no redirect, no compression, no cookie. A request
is written to its connection in one synchronous call (``Connection.send``), so whatever the
caller checks right before it (the send hook of resourceconsist.cluster.transport) runs in the
same step as the write.

Why hand-written: aiohttp's client, which served here before, spent about 310 us of CPU per
PATCH (its own request and response machinery: URL objects, header multidicts, timers, tracing
hooks, a stream reader per answer); this client, with the same TLS, headers and JSON encoding
and decoding, about 190 us (docs/benchmarks.md, "The write path", which also says why no other
library was taken). The pods a pass writes are most of what the controller does on its event
loop. Tested against a scripted server (tests/frame/test_http1.py), aiohttp's server over TLS
(tests/frame/test_http1_server.py) and a real API server (tests/frame/test_aiokube.py).
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import collections
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import cast

#: Bytes asyncio's TLS layer reads from a connection's socket at a time. asyncio's own default
#: is 256 KiB per connection, allocated zero-filled when the connection opens and so resident
#: for its life: 4 MiB for a pool of 16. A TLS record carries at most 16 KiB, the answers here
#: are mostly a few KiB, and a large one (a page of a list) only takes more reads of this size
#: (docs/benchmarks.md, "Memory").
TLS_READ_BUFFER = 32 * 1024


class _TLSProtocol(asyncio.sslproto.SSLProtocol):
    """asyncio's TLS layer with a read buffer of ``TLS_READ_BUFFER`` (its ``max_size``, the size of
    the buffer it allocates and of each read; the one setting asyncio exposes no argument for)."""

    max_size = TLS_READ_BUFFER


class CannotConnect(ConnectionError):
    """No connection to the host could be made (refused, unresolvable, TLS refused): the
    cause is ``os_error`` (and ``__cause__``)."""

    def __init__(self, where: str, err: BaseException) -> None:
        super().__init__(f"cannot connect to {where}: {err}")
        self.os_error = err


class ConnectionBroke(ConnectionError):
    """The connection ended, or failed, before the answer was whole; ``before_answer``: not a
    byte of the answer had come (a keep-alive connection the server had closed meanwhile)."""

    def __init__(self, message: str, *, before_answer: bool) -> None:
        super().__init__(message)
        self.before_answer = before_answer


class NoAnswerInTime(TimeoutError):
    """The server sent nothing for longer than the read timeout."""


class BadAnswer(ConnectionError):
    """The server's bytes are not an HTTP/1.1 answer this client reads."""


@dataclass
class Answer:
    """An answer's status line and headers (names in lower case), and its body once whole."""

    status: int
    reason: str
    headers: dict[str, str]
    body: bytes = b""
    #: The connection may carry another request.
    keep_alive: bool = True


#: Parser states: reading the head, a body of known length, chunk sizes, chunk data, the
#: line after a chunk, trailers, a body read until the connection ends, idle between answers.
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _TO_CLOSE, _IDLE = range(8)


class Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer parsed as it arrives.

    A buffered request (``answer``) resolves once the answer is whole; a streamed one
    (``head``, then ``chunks``) resolves with the head, its body's pieces then queued as they
    come (None after the last)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = time.monotonic()
        self._buf = bytearray()
        self._state = _IDLE
        self._left = 0  # bytes of the body or chunk still to come
        self._answer: Answer | None = None
        self._body: list[bytes] = []
        self._waiter: asyncio.Future[Answer] | None = None
        self._stream: asyncio.Queue[bytes | BaseException | None] | None = None
        self._got_any = False
        self._read_timeout: float = 60.0
        self._timer: asyncio.TimerHandle | None = None

    # -- the caller's side -----------------------------------------------------------------

    def send(
        self, data: bytes, *, stream: bool = False, read_timeout: float = 60.0
    ) -> asyncio.Future[Answer]:
        """Write a request (in this call, whole); the future of its answer: whole, or its head
        when ``stream`` (the body then comes through ``chunks``)."""
        assert self.transport is not None and self._waiter is None
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        self._stream = asyncio.Queue() if stream else None
        self._state, self._got_any, self._read_timeout = _HEAD, False, read_timeout
        self._arm()
        self.transport.write(data)
        return waiter

    async def chunks(self) -> AsyncIterator[bytes]:
        """The streamed body's pieces, as they arrive."""
        assert self._stream is not None
        while True:
            piece = await self._stream.get()
            if piece is None:
                return
            if isinstance(piece, BaseException):
                raise piece
            yield piece

    def close(self) -> None:
        self.closed = True
        self._disarm()
        if self.transport is not None:
            self.transport.close()

    # -- asyncio's side ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though not always asyncio's class: uvloop's are their own
        # (docs/reference/options.md, "The event loop").
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        if self._state == _TO_CLOSE:  # the body ran to the connection's end
            self._finish(keep_alive=False)
            return
        if self._state != _IDLE:
            detail = f": {exc}" if exc else ""
            self._fail(
                ConnectionBroke(
                    f"connection closed before the answer was whole{detail}", before_answer=not self._got_any
                )
            )

    def data_received(self, data: bytes) -> None:
        if self._state == _IDLE:
            # Nothing was asked: the connection is out of step with the server (or the server
            # says goodbye, as some send a 408 before closing); it carries no request more.
            self.close()
            return
        self._got_any = True
        self._arm()
        self._buf += data
        try:
            self._parse()
        except BadAnswer as err:
            self._fail(err)
            self.close()

    # -- parsing -------------------------------------------------------------------------------

    def _parse(self) -> None:
        buf = self._buf
        while buf:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > 1 << 20:
                        raise BadAnswer("an answer's head over 1 MiB")
                    return
                head = bytes(buf[:end])
                del buf[: end + 4]
                self._head(head)
            elif state == _LENGTH:
                piece = bytes(buf[: self._left])
                del buf[: len(piece)]
                self._left -= len(piece)
                self._take(piece)
                if self._left == 0:
                    self._finish()
            elif state in (_CHUNK_SIZE, _CHUNK_END, _TRAILERS):
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                line = bytes(buf[:end])
                del buf[: end + 2]
                if state == _CHUNK_END:
                    if line:
                        raise BadAnswer("no line end after a chunk")
                    self._state = _CHUNK_SIZE
                elif state == _TRAILERS:
                    if not line:
                        self._finish()
                else:
                    try:
                        self._left = int(line.split(b";", 1)[0], 16)
                    except ValueError:
                        raise BadAnswer(f"a chunk size that is not hexadecimal: {line[:40]!r}") from None
                    self._state = _CHUNK_DATA if self._left else _TRAILERS
            elif state == _CHUNK_DATA:
                piece = bytes(buf[: self._left])
                del buf[: len(piece)]
                self._left -= len(piece)
                self._take(piece)
                if self._left == 0:
                    self._state = _CHUNK_END
            elif state == _TO_CLOSE:
                self._take(bytes(buf))
                buf.clear()
            else:  # _IDLE: bytes after a whole answer, which no request asked for
                raise BadAnswer("bytes after the answer")

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise BadAnswer(f"not an HTTP/1.1 status line: {lines[0][:60]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(code)
        keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        self._answer = Answer(status, reason, headers, keep_alive=keep_alive)
        self._body = []
        if self._stream is not None and self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(self._answer)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = _CHUNK_SIZE
        elif "content-length" in headers:
            try:
                self._left = int(headers["content-length"])
            except ValueError:
                raise BadAnswer(
                    f"a Content-Length that is not a number: {headers['content-length']!r}"
                ) from None
            self._state = _LENGTH
            if self._left == 0:
                self._finish()
        elif status in (204, 304) or status < 200:
            self._finish()
        else:
            self._state = _TO_CLOSE
            self._answer.keep_alive = False

    def _take(self, piece: bytes) -> None:
        if not piece:
            return
        if self._stream is not None:
            self._stream.put_nowait(piece)
        else:
            self._body.append(piece)

    def _finish(self, *, keep_alive: bool = True) -> None:
        answer, self._answer = self._answer, None
        self._state = _IDLE
        self._disarm()
        if answer is None:
            return
        answer.keep_alive = answer.keep_alive and keep_alive
        if self._stream is not None:
            self._stream.put_nowait(None)
            return
        answer.body = b"".join(self._body) if len(self._body) != 1 else self._body[0]
        self._body = []
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    def _fail(self, err: BaseException) -> None:
        self._state = _IDLE
        self._disarm()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(err)
        elif self._stream is not None:
            self._stream.put_nowait(err)

    # -- the read timeout ----------------------------------------------------------------------

    def _arm(self) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(loop.time() + self._read_timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        self._fail(NoAnswerInTime(f"no answer for {self._read_timeout:g}s"))
        self.close()

    def done(self) -> None:
        """The caller is through with the answer (a streamed one may stop early): back to idle."""
        self._waiter = None
        if self._state != _IDLE:
            self.close()  # an answer not read to its end leaves nothing to reuse
        self._stream = None
        self.idle_since = time.monotonic()


@dataclass
class Pool:
    """At most ``limit`` keep-alive connections to the host of ``url``; a request beyond them
    waits for one (FIFO). Idle connections are kept ``idle_seconds`` at most."""

    url: str
    ssl_context: ssl.SSLContext | None
    server_hostname: str | None
    limit: int
    idle_seconds: float
    connect_timeout: float = 60.0
    #: TCP connections opened so far.
    opened: int = 0
    _idle: list[Connection] = field(default_factory=list)
    _busy: int = 0
    _waiters: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        #: The ``Host`` header: the URL's authority as written.
        self.authority = parts.netloc
        #: A path the API server is reached under (a proxy's prefix), before each request's.
        self.prefix = parts.path.rstrip("/")

    async def acquire(self) -> tuple[Connection, bool]:
        """A connection for one request, and whether it was used before (a pooled one)."""
        while self._busy >= self.limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._wake()  # handed a turn it will not take: pass it on
                raise
        self._busy += 1
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < self.idle_seconds:
                return conn, True
            conn.close()
        try:
            return await self._open(), False
        except BaseException:
            self._busy -= 1
            self._wake()
            raise

    async def _open(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            if self.ssl_context is None:
                _, conn = await asyncio.wait_for(
                    loop.create_connection(Connection, self.host, self.port), self.connect_timeout
                )
            else:
                conn = await asyncio.wait_for(self._open_tls(loop, self.ssl_context), self.connect_timeout)
        except (OSError, TimeoutError) as err:
            raise CannotConnect(self.authority, err) from err
        self.opened += 1
        return conn

    async def _open_tls(self, loop: asyncio.AbstractEventLoop, context: ssl.SSLContext) -> Connection:
        """A TLS connection as ``loop.create_connection(..., ssl=context)`` makes one (the TLS
        layer over a TCP transport, the connection told once the handshake is done), with the
        smaller read buffer of ``_TLSProtocol``."""
        conn = Connection()
        handshake = loop.create_future()
        # asyncio names the host as the server when no other name is given; so does this.
        tls = _TLSProtocol(loop, conn, context, handshake, server_hostname=self.server_hostname or self.host)
        raw, _ = await loop.create_connection(lambda: tls, self.host, self.port)
        try:
            await handshake
        except BaseException:
            raw.close()
            raise
        return conn

    def release(self, conn: Connection, *, reuse: bool) -> None:
        """The request on ``conn`` is over: keep it for the next one, or close it."""
        conn.done()
        self._busy -= 1
        if reuse and not conn.closed:
            self._idle.append(conn)
        else:
            conn.close()
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


def request_head(
    method: str, target: str, authority: str, headers: dict[str, str], length: int | None
) -> bytes:
    """The request line and headers of one request (``length``: its body's, None: no body)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {authority}"]
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1")
