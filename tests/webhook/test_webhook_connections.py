"""The webhook server's connection hygiene, over real sockets: every phase of a connection has a
deadline (TLS handshake, request headers, body, idle keep-alive), 2,000 idle connections are
accepted and then cut, the connection cap holds, and a client that goes away mid-body is not
a server error. No Kubernetes involved: the adapter names a fixed employer."""

from __future__ import annotations

import asyncio
import logging
import platform
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from resourceconsist.cluster import certs
from resourceconsist.cluster.cache import CacheReader, InformerFactory
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.testing import async_wait_for
from resourceconsist.webhook import ConnectionLimits, EmployerRef, WebhookOptions, WebhookServer

#: Short deadlines so the tests are quick; each test waits at most deadline + SLACK.
LIMITS = ConnectionLimits(handshake_timeout=1.0, header_timeout=1.0, body_timeout=1.0, idle_timeout=1.5)
SLACK = 10.0
REVIEW = (
    b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u",'
    b'"kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1",'
    b'"resource":"pods"},"operation":"CREATE","namespace":"ns","object":{"metadata":{"name":"p"},'
    b'"spec":{"containers":[{"name":"c","image":"x"}]}}}}'
)


class FixedAdapter:
    name = "fixed"

    def get_employers_by_employee(self, employee: KubeObject, reader: CacheReader) -> list[EmployerRef]:
        return [EmployerRef("Service", employee["metadata"]["namespace"], "fixed")]


class Tls:
    def __init__(self, ca: certs.KeyPair) -> None:
        self.client = ssl.create_default_context(cadata=ca.cert_pem.decode())
        # Python 3.13's default strict X.509 checks want an Authority Key Identifier, which
        # resourceconsist.cluster.certs does not write (the API server, in Go, does not ask for it).
        self.client.verify_flags &= ~ssl.VERIFY_X509_STRICT


async def _server(tmp_path: Path, limits: ConnectionLimits) -> tuple[WebhookServer, Tls]:
    ca = certs.make_ca("test-webhook-ca")
    serving = certs.make_signed(ca, "test-webhook", hosts=("127.0.0.1",))
    (tmp_path / "tls.crt").write_bytes(serving.cert_pem)
    (tmp_path / "tls.key").write_bytes(serving.key_pem)
    server = WebhookServer(
        [FixedAdapter()],
        WebhookOptions(host="127.0.0.1", port=0, cert_dir=tmp_path, bootstrap=None, limits=limits),
        # The adapter reads no cache: the informers never start, the client is never used.
        informers=InformerFactory(KubeClient(None)),
    )
    await server.start()
    return server, Tls(ca)


@pytest.fixture
async def webhook(tmp_path: Path) -> AsyncIterator[tuple[WebhookServer, Tls]]:
    server, tls = await _server(tmp_path, LIMITS)
    try:
        yield server, tls
    finally:
        await server.stop()


async def _closed_by_server(reader: asyncio.StreamReader, within: float) -> bytes:
    """Read until the server closes the connection, within ``within`` seconds; what it sent."""
    received = b""
    async with asyncio.timeout(within):
        while True:
            try:
                chunk = await reader.read(65536)
            except (ConnectionResetError, ssl.SSLError):
                return received
            if not chunk:
                return received
            received += chunk


async def _tls(server: WebhookServer, tls: Tls) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=tls.client, server_hostname="127.0.0.1"
    )


async def test_a_connection_that_never_starts_tls_is_closed_after_the_handshake_timeout(
    webhook: tuple[WebhookServer, Tls],
) -> None:
    server, _ = webhook
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    assert await _closed_by_server(reader, LIMITS.handshake_timeout + SLACK) == b""
    writer.close()
    assert server.connections.handshake_timeouts == 1
    assert server.connections.open == 0


async def test_a_stalled_tls_handshake_is_closed_after_the_handshake_timeout(
    webhook: tuple[WebhookServer, Tls],
) -> None:
    server, tls = webhook
    # The first bytes of a real ClientHello, then silence: TLS has started but cannot finish.
    hello = ssl.MemoryBIO()
    client = tls.client.wrap_bio(ssl.MemoryBIO(), hello, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(hello.read()[:20])
    assert await _closed_by_server(reader, LIMITS.handshake_timeout + SLACK) == b""
    writer.close()
    await async_wait_for(lambda: server.connections.open == 0, timeout=SLACK, message="the connection closed")
    assert server.connections.handshake_timeouts == 1


async def test_partial_request_headers_are_cut_after_the_header_timeout(
    webhook: tuple[WebhookServer, Tls],
) -> None:
    server, tls = webhook
    reader, writer = await _tls(server, tls)
    writer.write(b"POST /mutating-fixed HTTP/1.1\r\nHost: webhook\r\nContent-Type: appl")
    assert await _closed_by_server(reader, LIMITS.header_timeout + SLACK) == b""
    writer.close()
    assert server.connections.header_timeouts == 1


async def test_a_partial_body_is_cut_after_the_body_timeout_and_logged_at_info(
    webhook: tuple[WebhookServer, Tls], caplog: pytest.LogCaptureFixture
) -> None:
    server, tls = webhook
    caplog.set_level(logging.DEBUG)
    reader, writer = await _tls(server, tls)
    writer.write(
        b"POST /mutating-fixed HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(REVIEW)}\r\n\r\n".encode()
        + REVIEW[:30]
    )
    assert await _closed_by_server(reader, LIMITS.body_timeout + SLACK) == b""
    writer.close()
    assert server.connections.body_timeouts == 1
    assert any("no complete body" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(
    webhook: tuple[WebhookServer, Tls],
) -> None:
    server, tls = webhook
    reader, writer = await _tls(server, tls)
    # Two requests on one connection: keep-alive works...
    for _ in range(2):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: webhook\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), SLACK)
        assert head.startswith(b"HTTP/1.1 200")
        assert await asyncio.wait_for(reader.readexactly(2), SLACK) == b"ok"
    # ...and then silence is cut by the idle timeout, not the header timeout.
    assert await _closed_by_server(reader, LIMITS.idle_timeout + SLACK) == b""
    writer.close()
    assert server.connections.idle_timeouts == 1
    assert server.connections.header_timeouts == 0


async def test_a_client_that_disconnects_mid_body_is_logged_at_info_without_a_traceback(
    webhook: tuple[WebhookServer, Tls], caplog: pytest.LogCaptureFixture
) -> None:
    server, tls = webhook
    caplog.set_level(logging.DEBUG)
    _, writer = await _tls(server, tls)
    writer.write(
        b"POST /mutating-fixed HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(REVIEW)}\r\n\r\n".encode()
        + REVIEW[:30]
    )
    await writer.drain()
    await async_wait_for(
        lambda: server.connections.open == 1 and server.connections.accepted == 1, timeout=SLACK
    )
    writer.transport.abort()
    await async_wait_for(
        lambda: any("disconnected while sending the body" in r.getMessage() for r in caplog.records),
        timeout=SLACK,
        message="the server to notice the client left",
    )
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert server.connections.body_timeouts == 0


async def test_two_thousand_idle_connections_are_accepted_then_cut(
    webhook: tuple[WebhookServer, Tls],
) -> None:
    server, tls = webhook
    assert server.options.limits.max_connections > 2000
    # Opened from a thread: the server shares this event loop and must keep accepting.
    idle = await asyncio.to_thread(
        lambda: [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2000)]
    )
    try:
        for sock in idle:
            sock.setblocking(False)
        # All of them are accepted (the cap is not what bounds them)...
        await async_wait_for(
            lambda: server.connections.accepted >= 2000, timeout=SLACK, message="2000 connections accepted"
        )
        # ...and the handshake timeout closes every one of them.
        await async_wait_for(
            lambda: server.connections.open == 0, timeout=LIMITS.handshake_timeout + SLACK, message="all cut"
        )
        assert server.connections.handshake_timeouts == 2000
        assert server.connections.peak_open > 1000
        loop = asyncio.get_running_loop()
        for sock in idle[:: len(idle) // 20]:  # the client side sees the close too (a sample)
            assert await asyncio.wait_for(loop.sock_recv(sock, 1), SLACK) == b""
    finally:
        for sock in idle:
            sock.close()
    # And a real client is still served.
    reader, writer = await _tls(server, tls)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: webhook\r\nConnection: close\r\n\r\n")
    assert (await asyncio.wait_for(reader.read(), SLACK)).startswith(b"HTTP/1.1 200")
    writer.close()


async def test_the_connection_cap_holds_new_connections_until_a_slot_frees(tmp_path: Path) -> None:
    limits = ConnectionLimits(handshake_timeout=1.0, header_timeout=1.0, body_timeout=1.0, max_connections=2)
    server, tls = await _server(tmp_path, limits)
    try:
        squatters = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
        await async_wait_for(lambda: server.connections.open == 2, timeout=SLACK, message="2 accepted")
        # A third client waits in the backlog until the squatters are cut, then is served.
        reader, writer = await _tls(server, tls)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: webhook\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), limits.handshake_timeout + SLACK)
        assert answer.startswith(b"HTTP/1.1 200")
        assert server.connections.handshake_timeouts == 2
        assert server.connections.peak_open == 2
        writer.close()
        for _, squatter in squatters:
            squatter.close()
    finally:
        await server.stop()


async def test_a_valid_admission_over_a_kept_alive_connection(webhook: tuple[WebhookServer, Tls]) -> None:
    server, tls = webhook
    reader, writer = await _tls(server, tls)
    for _ in range(3):
        writer.write(
            b"POST /mutating-fixed HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(REVIEW)}\r\n\r\n".encode()
            + REVIEW
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), SLACK)
        assert head.startswith(b"HTTP/1.1 200")
        length = int(
            next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
        )
        body = await asyncio.wait_for(reader.readexactly(length), SLACK)
        assert b'"allowed":true' in body and b'"patch"' in body
    writer.close()
    assert server.connections.accepted == 1


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim exists in glibc only")
async def test_after_a_burst_of_tls_connections_the_heap_is_handed_back(
    webhook: tuple[WebhookServer, Tls],
) -> None:
    server, tls = webhook
    for _ in range(40):
        _, writer = await _tls(server, tls)
        writer.close()
    await async_wait_for(
        lambda: server.connections.heap_trims >= 1, timeout=SLACK, message="a heap trim after 40 TLS closes"
    )
