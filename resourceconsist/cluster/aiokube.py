"""The API server on the event loop: keep-alive connections built from a ``KubeClient``'s ``Access``.

``KubeClient`` reaches the API server through a urllib3 pool, one thread hand-off per call from
async code. For the frame's hot path (a pass's pod writes and readiness gates) that hand-off cost
about as much CPU as the request itself (docs/benchmarks.md, "The API transport").
``AsyncTransport`` sends the same requests from the event loop over one pool of HTTP/1.1
connections per loop (resourceconsist.cluster.http1): the same host, CA, client certificate and
bearer token (a token that can change, an exec plugin's or an in-cluster token file's, is asked
for again every few seconds, in a thread), the same bookkeeping (the client's ``RequestLedger``:
counters, observers, ``Reachability``, and the send checks, asked in the step that writes each
request to its connection) and the same errors (``kube.api_error``; the pool's own are
``ConnectionError`` and ``TimeoutError``, which ``kube.is_unreachable`` knows). It stands behind
``transport.LoopTransport`` (resourceconsist.cluster.transport, the seam both transports share),
and the client keeps it in its ``loop_transport`` slot, which only ``for_client`` fills.

A configuration the pool cannot honour (an official client's HTTP proxy or
``assert_hostname``: ``KubeClient.loop_refusal``) gets no transport: ``for_client`` answers None
and callers keep the thread path (``patch_optimistic``, ``patch`` below do that themselves).
docs/concepts.md, "The runtime".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, cast

import msgspec

from resourceconsist.cluster import http1, kube
from resourceconsist.cluster.kube import KubeClient, KubeObject, PatchType, Resource
from resourceconsist.cluster.kubeconfig import Access
from resourceconsist.cluster.transport import RequestLedger

log = logging.getLogger(__name__)

#: How long a token from a refresh hook is used before the hook is asked again (it reads a file
#: or runs an exec plugin only when its own expiry says so; the official client asks per request).
TOKEN_REFRESH_SECONDS = 10.0
#: Connections to the API server the pool keeps at most, requests beyond them waiting for
#: one: 16 in flight already take what one API server serves (docs/benchmarks.md measures its raw
#: PATCH rate with 16 clients), and each TLS connection holds asyncio's read buffer.
CONNECTIONS = 16
#: Seconds an idle connection stays pooled (client-go's IdleConnTimeout): bursts of writes
#: seconds apart reuse their connections instead of paying a TLS handshake each time again.
IDLE_CONNECTION_SECONDS = 90.0
#: Tries of a request whose connection failed before any answer (a keep-alive connection the
#: API server closed meanwhile): urllib3 retries such requests too.
_CONNECT_TRIES = 3


class AsyncTransport:
    """One event loop's connections to one API server, reporting to ``ledger`` (its client's); made
    by ``for_client``."""

    def __init__(self, access: Access, ledger: RequestLedger, loop: asyncio.AbstractEventLoop) -> None:
        self.ledger = ledger
        self.loop = loop
        self._access = access
        self._base = access.host
        self._token: str | None = None  # a token that can change, as last asked for
        self._token_at = float("-inf")
        self._refreshing = asyncio.Lock()  # one hook call at a time, its answer shared
        self.pool = http1.Pool(
            access.host,
            access.ssl_context(),  # None: an http:// host
            access.tls_server_name,
            limit=CONNECTIONS,
            idle_seconds=IDLE_CONNECTION_SECONDS,
        )

    @property
    def connections_opened(self) -> int:
        """TCP connections opened so far (connection reuse keeps it near the parallel requests)."""
        return self.pool.opened

    async def close(self) -> None:
        self.pool.close()

    # -- credentials ---------------------------------------------------------------------------

    @property
    def _token_changes(self) -> bool:
        """The token comes from a hook (an exec plugin, a token file) and can change; read each
        time, as the official client's hook may be set after the client is made."""
        source = self._access.token
        return source is not None and source.dynamic

    async def _headers(self, content_type: str, *, refresh: bool = False) -> dict[str, str]:
        if not self._token_changes:
            token = self._access.bearer()  # a token in memory, or none: no I/O
        else:
            source = self._access.token
            assert source is not None  # a token that changes has a source
            asked = time.monotonic()
            if refresh or asked - self._token_at >= TOKEN_REFRESH_SECONDS:
                async with self._refreshing:
                    if self._token_at < asked:  # no other request refreshed it meanwhile
                        # It may read a token file or run an exec plugin: never on the loop.
                        self._token = await asyncio.to_thread(source, refresh=refresh)
                        self._token_at = time.monotonic()
            token = self._token
        return kube.request_headers(content_type, token)

    # -- the one request primitive ---------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """Send one request and decode its JSON answer; a non-2xx answer raises ``kube.ApiError``'s
        subclass for its status, as ``KubeClient`` does."""
        ledger = self.ledger
        ledger.sent(method.lower(), path)
        data = b"" if body is None else msgspec.json.encode(body)
        started = time.monotonic()
        try:
            answer = await self._exchange(method, path, query, data, content_type)
        except Exception as err:  # no answer: refused, broken, timed out, or a send check said no
            ledger.unanswered(method, err, started)
            raise
        ledger.answered(method, path, answer.status, started)
        if answer.status >= 400:
            raise kube.api_error(answer.status, answer.reason, answer.body, method, path)
        return kube.decode_json(answer.body) if answer.body else {}

    async def _exchange(
        self, method: str, path: str, query: Mapping[str, Any] | None, data: bytes, content_type: str
    ) -> http1.Answer:
        """One request's answer, sent again where that is safe: on a pooled connection the server
        had closed (before any answer; not a POST), and once with a token asked for again after a
        401 of a token that changes."""
        pool = self.pool
        target = kube.request_url(pool.prefix, path, query)
        headers = await self._headers(content_type)
        refreshed = not self._token_changes
        tries = 0
        while True:
            tries += 1
            head = http1.request_head(method, target, pool.authority, headers, len(data) if data else None)
            conn, reused = await pool.acquire()
            try:
                # The send hook: the checks and the write in one step (transport's docstring).
                self.ledger.before_send(method, path)
                answer = await conn.send(head + data)
            except http1.ConnectionBroke as err:
                pool.release(conn, reuse=False)
                if err.before_answer and reused and tries < _CONNECT_TRIES and method != "POST":
                    continue
                raise
            except BaseException:
                pool.release(conn, reuse=False)
                raise
            pool.release(conn, reuse=answer.keep_alive)
            if answer.status == 401 and not refreshed:
                # A token that expired between two refreshes: ask the hook now, once.
                refreshed = True
                headers = await self._headers(content_type, refresh=True)
                continue
            return answer

    # -- the API the hot path uses -------------------------------------------------------------

    async def get(self, res: Resource, namespace: str | None, name: str) -> KubeObject:
        return cast(KubeObject, await self.request("GET", res.path(namespace, name)))

    async def get_or_none(self, res: Resource, namespace: str | None, name: str) -> KubeObject | None:
        try:
            return await self.get(res, namespace, name)
        except kube.NotFound:
            return None

    async def patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
    ) -> KubeObject:
        path = res.path(namespace, name, subresource)
        answer = await self.request(
            "PATCH", path, body=body, content_type=kube.PATCH_CONTENT_TYPES[patch_type]
        )
        return cast(KubeObject, answer)

    async def patch_optimistic(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        change: Callable[[KubeObject], dict[str, Any] | None],
        *,
        current: KubeObject | None = None,
        attempts: int = 8,
    ) -> tuple[KubeObject | None, bool]:
        """``KubeClient.patch_optimistic`` on the loop: the same loop (``kube.precondition_steps``),
        the same conflict count."""
        steps = kube.precondition_steps(
            res,
            namespace,
            name,
            change,
            current,
            attempts,
            functools.partial(self.ledger.conflicted, res.plural),
        )
        try:
            step = next(steps)
            while True:
                try:
                    if step is kube.READ_AGAIN:
                        answer: Any = await self.get_or_none(res, namespace, name)
                    else:
                        answer = await self.patch(res, namespace, name, step)
                except Exception as err:
                    step = steps.throw(err)
                else:
                    step = steps.send(answer)
        except StopIteration as done:
            return cast(tuple[KubeObject | None, bool], done.value)

    @contextlib.asynccontextmanager
    async def watch(
        self, res: Resource, namespace: str | None, resource_version: str, *, timeout_seconds: int = 300
    ) -> AsyncIterator[AsyncIterator[KubeObject]]:
        """A watch from ``resource_version`` with bookmarks: ``async with`` it for its events."""
        ledger = self.ledger
        pool = self.pool
        path = res.path(namespace)
        ledger.sent("watch", path)
        target = kube.request_url(pool.prefix, path, kube.watch_query(resource_version, timeout_seconds))
        head = http1.request_head(
            "GET", target, pool.authority, await self._headers("application/json"), None
        )
        started = time.monotonic()
        conn: http1.Connection | None = None
        try:
            conn, _ = await pool.acquire()
            ledger.before_send("GET", path)
            answer = await conn.send(head, stream=True, read_timeout=timeout_seconds + 30.0)
        except Exception as err:
            if conn is not None:
                pool.release(conn, reuse=False)
            ledger.unanswered("GET", err, started)
            raise
        ledger.answered("GET", path, answer.status, started)
        try:
            if answer.status >= 400:
                payload = b"".join([piece async for piece in conn.chunks()])
                raise kube.api_error(answer.status, answer.reason, payload, "GET", path)
            yield _events(conn)
        finally:
            pool.release(conn, reuse=False)


async def _events(conn: http1.Connection) -> AsyncIterator[KubeObject]:
    # Lines split by hand: an object may arrive in many pieces, and a piece hold many lines.
    lines = kube.Lines()
    async for chunk in conn.chunks():
        for line in lines.feed(chunk):
            yield kube.decode_json(line)


def for_client(client: KubeClient) -> AsyncTransport | None:
    """The running loop's transport to ``client``'s API server, made on first use and kept in
    the client's ``loop_transport`` slot; None when its configuration needs the thread path
    (logged once per client)."""
    loop = asyncio.get_running_loop()
    slot = client.loop_transport
    transport = slot.serving(loop)
    if isinstance(transport, AsyncTransport):
        return transport
    why = client.loop_refusal
    if why or client.access is None:
        if not slot.refusal_logged:
            slot.refusal_logged = True
            log.info("%s: API requests stay on threads: %s", client.reachability.name, why)
        return None
    transport = AsyncTransport(client.access, client.ledger, loop)
    # Closed when its loop shuts its async generators down (asyncio.run and pytest's loops do,
    # last thing), so a pool never outlives the loop it belongs to, whoever made the loop.
    # The loop holds its generators weakly: the slot keeps this one.
    closer = _close_at_shutdown(transport)
    slot.keep(transport, (closer, loop.create_task(_start(closer))))
    return transport


async def _start(closer: AsyncIterator[None]) -> None:
    await anext(closer)


async def _close_at_shutdown(transport: AsyncTransport) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await transport.close()


async def patch_optimistic(
    writer: Any,
    res: Resource,
    namespace: str | None,
    name: str,
    change: Callable[[KubeObject], dict[str, Any] | None],
    *,
    current: KubeObject | None = None,
) -> tuple[KubeObject | None, bool]:
    """``writer.patch_optimistic`` from async code: on the loop when ``writer`` is a ``KubeClient``
    the transport serves, else in the frame's threads (an in-memory writer, an unsupported
    configuration)."""
    transport = _serving(writer)
    if transport is not None:
        return await transport.patch_optimistic(res, namespace, name, change, current=current)
    return cast(
        tuple[KubeObject | None, bool],
        await asyncio.to_thread(
            functools.partial(writer.patch_optimistic, current=current), res, namespace, name, change
        ),
    )


async def patch(
    writer: Any,
    res: Resource,
    namespace: str | None,
    name: str,
    body: Any,
    *,
    patch_type: PatchType = "merge",
    subresource: str | None = None,
) -> KubeObject:
    """``writer.patch`` from async code, on the loop where it can be (as ``patch_optimistic``)."""
    transport = _serving(writer)
    if transport is not None:
        return await transport.patch(
            res, namespace, name, body, patch_type=patch_type, subresource=subresource
        )
    write = functools.partial(writer.patch, patch_type=patch_type, subresource=subresource)
    return cast(KubeObject, await asyncio.to_thread(write, res, namespace, name, body))


def _serving(writer: Any) -> AsyncTransport | None:
    """The loop's transport for ``writer`` when it is a ``KubeClient`` the transport serves; None
    sends its calls to the frame's threads (an in-memory writer, an unsupported configuration)."""
    return for_client(writer) if isinstance(writer, KubeClient) else None
