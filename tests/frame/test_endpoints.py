"""The manager's endpoint server (resourceconsist.runtime.endpoints) on a free loopback port, asked
with raw bytes: keep-alive and its ends (``Connection: close``, HTTP/1.0, the client closing),
HEAD, unknown paths and methods, a guard that answers before any path, a route that fails, the
requests it refuses (a body, a head too long, bytes that are not HTTP), and a close that ends
idle connections and answers still being made. The paths themselves are tested through the
manager: tests/frame/test_metrics.py, test_secure_metrics.py, tests/extensions/test_drain_wait.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import pytest

from resourceconsist.runtime.endpoints import MAX_HEAD, EndpointServer, Reply


async def _hello(query: Mapping[str, str]) -> Reply:
    return Reply.text(f"hello {query.get('who', 'nobody')}")


async def _broken(_: Mapping[str, str]) -> Reply:
    raise RuntimeError("the route failed")


class Client:
    """One raw connection to the server."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def ask(self, raw: bytes, *, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
        self.writer.write(raw)
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        line, *fields = head[:-4].decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
        length = 0 if head_only else int(headers["content-length"])
        body = await asyncio.wait_for(self.reader.readexactly(length), 5)
        return int(line.split(" ")[1]), headers, body

    async def closed_by_server(self) -> bool:
        return await asyncio.wait_for(self.reader.read(1), 5) == b""


@pytest.fixture
async def server() -> AsyncIterator[EndpointServer]:
    s = EndpointServer({"/hello": _hello, "/broken": _broken})
    await s.start("127.0.0.1", 0)
    yield s
    await s.close()


async def _connect(s: EndpointServer) -> Client:
    return Client(*await asyncio.open_connection("127.0.0.1", s.port))


def _get(path: str, *extra: str, version: str = "HTTP/1.1") -> bytes:
    return "\r\n".join([f"GET {path} {version}", "Host: x", *extra, "", ""]).encode()


async def test_keep_alive_answers_many_requests_on_one_connection_until_connection_close(
    server: EndpointServer,
) -> None:
    client = await _connect(server)
    for who in ("a", "b", "c"):
        status, headers, body = await client.ask(_get(f"/hello?who={who}&who=ignored"))
        assert (status, body) == (200, f"hello {who}".encode())
        assert headers["content-type"] == "text/plain; charset=utf-8"
        assert "connection" not in headers
    status, headers, body = await client.ask(_get("/hello", "Connection: close"))
    assert (status, headers["connection"], body) == (200, "close", b"hello nobody")
    assert await client.closed_by_server()


async def test_http_1_0_gets_one_answer_then_the_connection_closes(server: EndpointServer) -> None:
    client = await _connect(server)
    status, _, body = await client.ask(_get("/hello", version="HTTP/1.0"))
    assert (status, body) == (200, b"hello nobody")
    assert await client.closed_by_server()


async def test_head_answers_the_length_without_the_body(server: EndpointServer) -> None:
    client = await _connect(server)
    status, headers, _ = await client.ask(b"HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\n", head_only=True)
    assert (status, headers["content-length"]) == (200, str(len(b"hello nobody")))
    # Nothing followed the head: the next answer's status line comes right after it.
    status, _, body = await client.ask(_get("/hello?who=next"))
    assert (status, body) == (200, b"hello next")


async def test_unknown_paths_other_methods_and_failing_routes_get_their_status(
    server: EndpointServer,
) -> None:
    client = await _connect(server)
    assert (await client.ask(_get("/nope")))[0] == 404
    status, headers, _ = await client.ask(b"DELETE /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, headers["allow"]) == (405, "GET, HEAD")
    assert (await client.ask(_get("/broken")))[0] == 500
    assert (await client.ask(_get("/hello")))[0] == 200, "the connection serves on after a failed route"


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"POST /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", 413),
        (b"POST /hello HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 413),
        (b"GET /hello HTTP/1.1\r\nX-Long: " + b"x" * MAX_HEAD + b"\r\n\r\n", 431),
        (b"HELLO THERE\r\n\r\n", 400),
        (b"GET /hello HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"GET /hello SPDY/3\r\n\r\n", 400),
    ],
    ids=["body", "chunked body", "head too long", "not http", "bad header", "not http/1"],
)
async def test_a_request_it_does_not_read_gets_one_answer_and_the_connection_closes(
    server: EndpointServer, raw: bytes, status: int
) -> None:
    client = await _connect(server)
    got, headers, _ = await client.ask(raw)
    assert (got, headers["connection"]) == (status, "close")
    assert await client.closed_by_server()


async def test_the_guard_answers_every_path_before_routing() -> None:
    asked: list[tuple[str | None, str, str]] = []

    async def guard(authorization: str | None, method: str, path: str) -> tuple[int, str]:
        asked.append((authorization, method, path))
        return (200, "") if authorization == "Bearer good" else (401, "Unauthorized")

    s = EndpointServer({"/hello": _hello}, guard)
    await s.start("127.0.0.1", 0)
    try:
        client = await _connect(s)
        status, _, body = await client.ask(_get("/hello"))
        assert (status, body) == (401, b"Unauthorized\n")
        assert (await client.ask(_get("/nope")))[0] == 401, "refused before the path is looked up"
        status, _, body = await client.ask(_get("/hello?who=me", "Authorization: Bearer good"))
        assert (status, body) == (200, b"hello me")
        assert asked[-1] == ("Bearer good", "GET", "/hello")
    finally:
        await s.close()


async def test_close_ends_idle_connections_and_answers_being_made() -> None:
    entered = asyncio.Event()

    async def slow(_: Mapping[str, str]) -> Reply:
        entered.set()
        await asyncio.sleep(60)
        return Reply.text("late")

    s = EndpointServer({"/slow": slow, "/hello": _hello})
    await s.start("127.0.0.1", 0)
    idle = await _connect(s)
    assert (await idle.ask(_get("/hello")))[0] == 200
    waiting = await _connect(s)
    waiting.writer.write(_get("/slow"))
    await asyncio.wait_for(entered.wait(), 5)
    await asyncio.wait_for(s.close(), 5)
    assert await idle.closed_by_server()
    assert await waiting.closed_by_server()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", s.port)


async def test_an_address_in_use_raises_oserror(server: EndpointServer) -> None:
    other = EndpointServer({"/hello": _hello})
    with pytest.raises(OSError, match="address already in use"):
        await other.start("127.0.0.1", server.port)
