"""The loop transport's HTTP/1.1 client (resourceconsist.cluster.http1) against a scripted server
on a loopback port: every way an answer may be framed and cut, the read timeout, the pool's bound
and its waiters. The transport on a real API server is tests/frame/test_aiokube.py's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from resourceconsist.cluster import http1
from resourceconsist.testing import async_wait_for

#: What the scripted server answers: the bytes of a whole answer, sent as the pieces given.
Script = Callable[[bytes], list[bytes]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], asyncio.Future[http1.Pool]]]:
    servers: list[asyncio.Server] = []
    pools: list[http1.Pool] = []

    async def start(script: Script, *, limit: int = 4, close_after: bool = False) -> http1.Pool:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":")[1])
                    body = await reader.readexactly(length) if length else b""
                    for piece in script(head + body):
                        writer.write(piece)
                        await writer.drain()
                        await asyncio.sleep(0)
                    if close_after:
                        break
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        pools.append(http1.Pool(f"http://127.0.0.1:{port}", None, None, limit=limit, idle_seconds=90.0))
        return pools[-1]

    yield start  # type: ignore[misc]
    # The client's kept-alive connections first: from Python 3.12 a server's wait_closed waits
    # for every connection it accepted to end.
    for pool in pools:
        pool.close()
    for server in servers:
        server.close()
        await server.wait_closed()


def _bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


async def _get(pool: http1.Pool, body: bytes = b"") -> http1.Answer:
    conn, _ = await pool.acquire()
    try:
        answer = await conn.send(
            http1.request_head("PATCH", "/x", pool.authority, {}, len(body)) + body, read_timeout=5.0
        )
    except BaseException:
        pool.release(conn, reuse=False)
        raise
    pool.release(conn, reuse=answer.keep_alive)
    return answer


async def test_an_answer_of_known_length_cut_at_every_byte_is_read_whole(serve: object) -> None:
    payload = b'{"kind":"Pod"}'
    answer_bytes = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)
    pool = await serve(lambda request: _bytewise(answer_bytes))  # type: ignore[operator]
    first = await _get(pool, b"{}")
    second = await _get(pool, b"{}")
    assert (first.status, first.body, second.body) == (200, payload, payload)
    assert pool.opened == 1, "the second request reused the kept-alive connection"


async def test_a_chunked_answer_with_extensions_and_trailers_is_joined(serve: object) -> None:
    answer_bytes = (
        b"HTTP/1.1 409 Conflict\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    pool = await serve(lambda request: _bytewise(answer_bytes))  # type: ignore[operator]
    answer = await _get(pool)
    assert (answer.status, answer.reason, answer.body) == (409, "Conflict", b"hello world")
    assert (await _get(pool)).body == b"hello world"
    assert pool.opened == 1


async def test_an_answer_read_to_the_connections_end_is_not_reused(serve: object) -> None:
    answer_bytes = b"HTTP/1.1 200 OK\r\n\r\nall of it"
    pool = await serve(lambda request: [answer_bytes], close_after=True)  # type: ignore[operator]
    answer = await _get(pool)
    assert answer.body == b"all of it" and not answer.keep_alive
    assert (await _get(pool)).body == b"all of it"
    assert pool.opened == 2


async def test_a_connection_closed_before_any_answer_says_so(serve: object) -> None:
    pool = await serve(lambda request: [], close_after=True)  # type: ignore[operator]
    with pytest.raises(http1.ConnectionBroke) as caught:
        await _get(pool)
    assert caught.value.before_answer


async def test_a_connection_closed_inside_an_answer_is_broken_after_the_answer_began(serve: object) -> None:
    pool = await serve(  # type: ignore[operator]
        lambda request: [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"], close_after=True
    )
    with pytest.raises(http1.ConnectionBroke) as caught:
        await _get(pool)
    assert not caught.value.before_answer


async def test_a_server_that_says_nothing_times_out(serve: object) -> None:
    pool = await serve(lambda request: [])  # type: ignore[operator]
    conn, _ = await pool.acquire()
    with pytest.raises(http1.NoAnswerInTime):
        await conn.send(http1.request_head("GET", "/x", pool.authority, {}, None), read_timeout=0.2)
    assert conn.closed
    pool.release(conn, reuse=False)


async def test_bytes_that_are_not_http_fail_the_request(serve: object) -> None:
    pool = await serve(lambda request: [b"SSH-2.0-OpenSSH\r\n\r\n"])  # type: ignore[operator]
    with pytest.raises(http1.BadAnswer):
        await _get(pool)


async def test_the_pool_opens_at_most_its_limit_and_serves_waiters_in_order(serve: object) -> None:
    answer_bytes = b"HTTP/1.1 204 No Content\r\n\r\n"
    pool = await serve(lambda request: [answer_bytes], limit=2)  # type: ignore[operator]
    held = [await pool.acquire() for _ in range(2)]
    order: list[int] = []

    async def wait(i: int) -> None:
        conn, _ = await pool.acquire()
        order.append(i)
        pool.release(conn, reuse=True)

    waiters = [asyncio.create_task(wait(i)) for i in range(3)]
    cancelled = asyncio.create_task(wait(99))
    await asyncio.sleep(0.05)
    cancelled.cancel()
    assert order == []
    for conn, _ in held:
        pool.release(conn, reuse=True)
    await asyncio.gather(*waiters)
    assert order == [0, 1, 2] and pool.opened == 2
    assert (await _get(pool)).status == 204
    assert pool.opened == 2


async def test_a_streamed_answer_comes_in_pieces_and_ends(serve: object) -> None:
    answer_bytes = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab\n\r\n2\r\nc\n\r\n0\r\n\r\n"
    pool = await serve(lambda request: _bytewise(answer_bytes))  # type: ignore[operator]
    conn, _ = await pool.acquire()
    head = await conn.send(http1.request_head("GET", "/w", pool.authority, {}, None), stream=True)
    assert head.status == 200
    assert b"".join([piece async for piece in conn.chunks()]) == b"ab\nc\n"
    pool.release(conn, reuse=False)


def test_a_request_head_carries_host_headers_and_length() -> None:
    head = http1.request_head("PATCH", "/api/v1/x?a=1", "h:6443", {"Accept": "application/json"}, 2)
    assert head == (
        b"PATCH /api/v1/x?a=1 HTTP/1.1\r\nHost: h:6443\r\nAccept: application/json\r\n"
        b"Content-Length: 2\r\n\r\n"
    )


async def test_bytes_sent_unasked_between_answers_end_the_connection() -> None:
    answer_bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    say_more = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer_bytes)
            await writer.drain()
            await say_more.wait()  # then, with no request asked, a 408 as some servers send
            writer.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            await reader.read()  # until the client closes
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = http1.Pool(f"http://127.0.0.1:{port}", None, None, limit=1, idle_seconds=90.0)
    try:
        assert (await _get(pool)).body == b"ok"
        [idle] = pool._idle
        assert not idle.closed
        say_more.set()

        async def closed() -> bool:
            return idle.closed

        await async_wait_for(closed, timeout=10, message="the connection that got bytes unasked closed")
        assert (await _get(pool)).body == b"ok"
        assert pool.opened == 2
    finally:
        pool.close()
        server.close()
        await server.wait_closed()
