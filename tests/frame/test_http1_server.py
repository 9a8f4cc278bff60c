"""The loop transport's HTTP/1.1 client (resourceconsist.cluster.http1) against a real HTTP server:
aiohttp's, on a free loopback port, over TLS with a CA of the test's own (resourceconsist.cluster
.certs). Chunked bodies, keep-alive reuse, a connection reset before and inside an answer, the
read timeout, a server that closes idle connections or says ``Connection: close``, and a TLS
peer the client does not trust. The byte-level framing cuts are tests/frame/test_http1.py's; the
transport on a real API server (its retries, the send hook, the fence) is
tests/frame/test_aiokube.py's."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from resourceconsist.cluster import certs, http1
from resourceconsist.testing import async_wait_for

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Server:
    """aiohttp's server on a loopback port over TLS, with the handlers given by path."""

    def __init__(self, tmp: Path, handlers: dict[str, Handler], keepalive: float) -> None:
        self.ca = certs.make_ca("http1-test-ca")
        leaf = certs.make_signed(self.ca, "localhost", hosts=("127.0.0.1", "localhost"))
        (tmp / "tls.crt").write_bytes(leaf.cert_pem)
        (tmp / "tls.key").write_bytes(leaf.key_pem)
        self.serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.serving.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
        app = web.Application()
        for path, handler in handlers.items():
            app.router.add_route("*", path, handler)
        # A handler still waiting at teardown (the slow one) is cancelled after a second.
        self.runner = web.AppRunner(app, keepalive_timeout=keepalive, shutdown_timeout=1.0)
        self.url = ""

    async def start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=self.serving)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"https://{host}:{port}"

    def trusting(self) -> ssl.SSLContext:
        """A client context that trusts the server's CA."""
        return ssl.create_default_context(cadata=self.ca.cert_pem.decode())

    def pool(self, context: ssl.SSLContext | None = None, *, limit: int = 4) -> http1.Pool:
        return http1.Pool(self.url, context or self.trusting(), None, limit=limit, idle_seconds=90.0)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    started: list[Server] = []

    async def start(handlers: dict[str, Handler], *, keepalive: float = 75.0) -> Server:
        s = Server(tmp_path, handlers, keepalive)
        await s.start()
        started.append(s)
        return s

    yield start
    for s in started:
        await s.runner.cleanup()


async def _ask(
    pool: http1.Pool, method: str, path: str, body: bytes = b"", *, read_timeout: float = 10.0
) -> http1.Answer:
    conn, _ = await pool.acquire()
    try:
        head = http1.request_head(method, path, pool.authority, {}, len(body) if body else None)
        answer = await conn.send(head + body, read_timeout=read_timeout)
    except BaseException:
        pool.release(conn, reuse=False)
        raise
    pool.release(conn, reuse=answer.keep_alive)
    return answer


async def _echo(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    return web.Response(body=request.method.encode() + b" " + body, content_type="application/json")


async def _chunked(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(status=200)
    response.enable_chunked_encoding()
    await response.prepare(request)
    for i in range(50):
        await response.write(b"%d," % i * 100)  # pieces of a few hundred bytes, each a chunk
    await response.write_eof()
    return response


async def _reset_before_answer(request: web.Request) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.abort()  # a TCP reset (SO_LINGER 0 is not needed: abort drops the buffer)
    raise ConnectionResetError("reset by the test")


async def _reset_inside_answer(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(status=200)
    response.content_length = 100_000
    await response.prepare(request)
    await response.write(b"x" * 1000)
    assert request.transport is not None
    request.transport.abort()
    return response


async def _slow(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(30)  # longer than any read timeout below: the server never answers in time
    return web.Response(text="late")


async def _closing(request: web.Request) -> web.StreamResponse:
    return web.Response(text="bye", headers={"Connection": "close"})


async def test_keep_alive_carries_many_requests_with_bodies_over_one_tls_connection(server: object) -> None:
    s = await server({"/echo": _echo})  # type: ignore[operator]
    pool = s.pool()
    answers = [await _ask(pool, "PATCH", "/echo", b'{"n":%d}' % i) for i in range(20)]
    assert [a.body for a in answers] == [b'PATCH {"n":%d}' % i for i in range(20)]
    assert all(a.status == 200 and a.keep_alive for a in answers)
    assert pool.opened == 1, "one TLS handshake for twenty requests"
    pool.close()


async def test_concurrent_requests_open_at_most_the_pools_limit(server: object) -> None:
    s = await server({"/echo": _echo})  # type: ignore[operator]
    pool = s.pool(limit=3)
    answers = await asyncio.gather(*(_ask(pool, "GET", "/echo") for _ in range(30)))
    assert {a.body for a in answers} == {b"GET "}
    assert pool.opened <= 3
    pool.close()


async def test_a_chunked_answer_is_joined_and_the_connection_reused(server: object) -> None:
    s = await server({"/chunked": _chunked})  # type: ignore[operator]
    pool = s.pool()
    expected = b"".join(b"%d," % i * 100 for i in range(50))
    first = await _ask(pool, "GET", "/chunked")
    second = await _ask(pool, "GET", "/chunked")
    assert first.headers.get("transfer-encoding") == "chunked"
    assert first.body == second.body == expected
    assert pool.opened == 1
    pool.close()


async def test_a_chunked_answer_streams_in_pieces(server: object) -> None:
    s = await server({"/chunked": _chunked})  # type: ignore[operator]
    pool = s.pool()
    conn, _ = await pool.acquire()
    head = await conn.send(http1.request_head("GET", "/chunked", pool.authority, {}, None), stream=True)
    pieces = [piece async for piece in conn.chunks()]
    pool.release(conn, reuse=False)
    assert head.status == 200
    assert b"".join(pieces) == b"".join(b"%d," % i * 100 for i in range(50))
    pool.close()


async def test_a_reset_before_any_answer_is_broken_before_the_answer(server: object) -> None:
    s = await server({"/reset": _reset_before_answer, "/echo": _echo})  # type: ignore[operator]
    pool = s.pool()
    with pytest.raises(http1.ConnectionBroke) as caught:
        await _ask(pool, "PATCH", "/reset", b"{}")
    assert caught.value.before_answer
    assert (await _ask(pool, "GET", "/echo")).status == 200, "the pool recovers with a new connection"
    assert pool.opened == 2
    pool.close()


async def test_a_reset_inside_an_answer_is_broken_after_the_answer_began(server: object) -> None:
    s = await server({"/reset": _reset_inside_answer})  # type: ignore[operator]
    pool = s.pool()
    with pytest.raises(http1.ConnectionBroke) as caught:
        await _ask(pool, "GET", "/reset")
    assert not caught.value.before_answer
    pool.close()


async def test_a_server_that_does_not_answer_in_time_times_out_and_the_connection_goes(
    server: object,
) -> None:
    s = await server({"/slow": _slow, "/echo": _echo})  # type: ignore[operator]
    pool = s.pool()
    conn, _ = await pool.acquire()
    with pytest.raises(http1.NoAnswerInTime):
        await conn.send(http1.request_head("GET", "/slow", pool.authority, {}, None), read_timeout=0.3)
    assert conn.closed
    pool.release(conn, reuse=False)
    assert (await _ask(pool, "GET", "/echo")).status == 200
    pool.close()


async def test_connection_close_is_honoured(server: object) -> None:
    s = await server({"/closing": _closing})  # type: ignore[operator]
    pool = s.pool()
    first = await _ask(pool, "GET", "/closing")
    second = await _ask(pool, "GET", "/closing")
    assert (first.body, first.keep_alive, second.body) == (b"bye", False, b"bye")
    assert pool.opened == 2, "a connection the server said it closes is not reused"
    pool.close()


async def test_an_idle_connection_the_server_closed_is_not_reused(server: object) -> None:
    s = await server({"/echo": _echo}, keepalive=0.2)  # type: ignore[operator]
    pool = s.pool()
    assert (await _ask(pool, "GET", "/echo")).keep_alive
    [idle] = pool._idle

    async def closed_by_the_server() -> bool:
        return idle.closed

    await async_wait_for(closed_by_the_server, timeout=10, message="the server's keep-alive timeout")
    assert (await _ask(pool, "GET", "/echo")).status == 200
    assert pool.opened == 2
    pool.close()


async def test_a_server_the_client_does_not_trust_cannot_be_connected_to(server: object) -> None:
    s = await server({"/echo": _echo})  # type: ignore[operator]
    stranger = ssl.create_default_context(cadata=certs.make_ca("another-ca").cert_pem.decode())
    pool = s.pool(stranger)
    with pytest.raises(http1.CannotConnect) as caught:
        await _ask(pool, "GET", "/echo")
    assert isinstance(caught.value.os_error, ssl.SSLCertVerificationError)
    pool.close()


async def test_nothing_listening_cannot_be_connected_to() -> None:
    from resourceconsist.testing.controlplane import free_port

    pool = http1.Pool(f"http://127.0.0.1:{free_port()}", None, None, limit=1, idle_seconds=1.0)
    with pytest.raises(http1.CannotConnect):
        await _ask(pool, "GET", "/")
    assert pool.opened == 0


async def _large(request: web.Request) -> web.StreamResponse:
    return web.Response(body=bytes(range(256)) * 8192)  # 2 MiB: many TLS records, many reads


async def test_a_tls_connection_reads_through_a_small_buffer_and_a_large_answer_arrives_whole(
    server: object,
) -> None:
    # asyncio's TLS layer allocates a 256 KiB read buffer per connection, resident for the
    # connection's life; the pool's connections read through TLS_READ_BUFFER bytes instead.
    s = await server({"/large": _large})  # type: ignore[operator]
    pool = s.pool()
    conn, _ = await pool.acquire()
    assert conn.transport is not None
    tls = conn.transport._ssl_protocol
    assert len(tls._ssl_buffer) == http1.TLS_READ_BUFFER < 256 * 1024
    pool.release(conn, reuse=True)
    answers = [await _ask(pool, "GET", "/large") for _ in range(2)]
    assert [a.body for a in answers] == [bytes(range(256)) * 8192] * 2
    assert pool.opened == 1
    pool.close()
