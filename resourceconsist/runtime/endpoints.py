"""The manager's HTTP endpoints on asyncio's own server: ``/healthz``, ``/readyz`` and ``/metrics``
(resourceconsist.runtime.metrics) and the drain endpoint (resourceconsist.runtime.drain).

``EndpointServer`` serves a table of paths, each a coroutine from the request's query to a
``Reply`` whose body is whole, for GET and HEAD; with a ``guard`` (secure metrics:
resourceconsist.runtime.metricsauth), every request is answered by the guard's refusal unless it
says 200. Keep-alive as HTTP/1.1 has it (``Connection: close`` and HTTP/1.0 end the connection
after the answer), an idle connection closed after ``KEEPALIVE_SECONDS``; a request with a body
it does not read, a head longer than ``MAX_HEAD`` or bytes that are not HTTP/1.x get one answer
(400, 413 or 431) and the connection closes.

Why hand-written: aiohttp's server, which served these paths before, is the one part of aiohttp a
``run`` used (the loop transport has its own client, resourceconsist.cluster.http1), and
importing it costs about 9.5 MB of resident memory, a sixth of what the process takes at start,
for a few GET paths whose answers are in memory (docs/benchmarks.md, "Memory"). The standard
library's ``http.server`` answers from threads: ``/healthz`` would then answer while the event
loop is stuck, and the drain answers and the secure metrics' reviews run on the loop. Tested in
tests/frame/test_endpoints.py and through the manager's endpoints (tests/frame/test_metrics.py,
test_secure_metrics.py, tests/extensions/test_drain_wait.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: Seconds an idle keep-alive connection is kept (aiohttp's server's default).
KEEPALIVE_SECONDS = 75.0
#: The longest request line and headers read, in bytes.
MAX_HEAD = 16 * 1024
#: The content type of a text answer.
TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class Reply:
    """One answer: its status, body and content type."""

    status: int = 200
    body: bytes = b""
    content_type: str = TEXT

    @classmethod
    def text(cls, text: str, status: int = 200) -> Reply:
        return cls(status, text.encode())


#: A path's handler: the request's query (each name's first value) to its answer.
Route = Callable[[Mapping[str, str]], Awaitable[Reply]]
#: A guard of every path: (the ``Authorization`` header, the method, the path) to the HTTP status
#: (200: serve it) and the text of a refusal.
Guard = Callable[[str | None, str, str], Awaitable[tuple[int, str]]]


class BadRequest(Exception):
    """A request this server does not read; the connection closes after the answer."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    keep_alive: bool


class EndpointServer:
    """``routes`` served on one address (``start``), until ``close``."""

    def __init__(self, routes: Mapping[str, Route], guard: Guard | None = None) -> None:
        self.routes = dict(routes)
        self.guard = guard
        #: The port bound (the one asked for, or the one given for port 0).
        self.port = 0
        self._server: asyncio.Server | None = None
        self._live: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> None:
        """Listen on ``host`` (empty: every interface) and ``port`` (0: any free one); an
        address that cannot be bound raises ``OSError``."""
        self._server = await asyncio.start_server(
            self._serve, host or None, port, ssl=ssl_context, limit=MAX_HEAD
        )
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and end every connection, answers still being made included."""
        if self._server is None:
            return
        self._server.close()
        for task in list(self._live):
            task.cancel()
        await asyncio.gather(*self._live, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._live.add(task)
        try:
            while True:
                try:
                    request = await _read_request(reader)
                except BadRequest as err:
                    _write(writer, "GET", Reply.text(f"{err}\n", err.status), keep_alive=False)
                    await writer.drain()
                    return
                if request is None:
                    return
                reply = await self._answer(request)
                _write(writer, request.method, reply, keep_alive=request.keep_alive)
                await writer.drain()
                if not request.keep_alive:
                    return
        except (ConnectionError, asyncio.CancelledError):
            # Gone, or the server closes: nobody awaits this task (asyncio's server made it).
            return
        finally:
            self._live.discard(task)
            writer.close()

    async def _answer(self, request: Request) -> Reply:
        if self.guard is not None:
            authorization = request.headers.get("authorization")
            status, text = await self.guard(authorization, request.method, request.path)
            if status != 200:
                return Reply.text(text + "\n", status)
        route = self.routes.get(request.path)
        if route is None:
            return Reply.text("404: Not Found", 404)
        if request.method not in ("GET", "HEAD"):
            return Reply.text("405: Method Not Allowed", 405)
        try:
            return await route(request.query)
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            return Reply.text("500: Internal Server Error", 500)


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request on the connection; None when the client closed it or stayed idle for
    ``KEEPALIVE_SECONDS``."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), KEEPALIVE_SECONDS)
    except (asyncio.IncompleteReadError, TimeoutError):
        return None
    except asyncio.LimitOverrunError:
        raise BadRequest(431, "Request Header Fields Too Large") from None
    line, *fields = head[:-4].decode("latin-1").split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(400, "Bad Request")
    method, target, version = parts
    headers: dict[str, str] = {}
    for field in fields:
        name, sep, value = field.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(400, "Bad Request")
        headers[name.lower()] = value.strip()
    if "transfer-encoding" in headers or headers.get("content-length", "0") != "0":
        raise BadRequest(413, "Payload Too Large")  # no path here reads a body
    url = urllib.parse.urlsplit(target)
    query: dict[str, str] = {}
    for name, value in urllib.parse.parse_qsl(url.query, keep_blank_values=True):
        query.setdefault(name, value)
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return Request(method, urllib.parse.unquote(url.path), query, headers, keep_alive)


def _write(writer: asyncio.StreamWriter, method: str, reply: Reply, *, keep_alive: bool) -> None:
    phrase = ""
    with contextlib.suppress(ValueError):
        phrase = http.HTTPStatus(reply.status).phrase
    lines = [
        f"HTTP/1.1 {reply.status} {phrase}",
        f"Content-Type: {reply.content_type}",
        f"Content-Length: {len(reply.body)}",
    ]
    if reply.status == 405:
        lines.append("Allow: GET, HEAD")
    if not keep_alive:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    writer.write(head if method == "HEAD" else head + reply.body)
