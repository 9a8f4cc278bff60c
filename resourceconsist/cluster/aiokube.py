"""The API server on the event loop: an aiohttp session built from a ``KubeClient``'s ``Access``.

``KubeClient`` reaches the API server through a urllib3 pool, one thread hand-off per call from
async code. For the frame's hot path (a pass's pod writes and readiness gates) that hand-off cost
about as much CPU as the request itself (docs/benchmarks.md, "The API transport").
``AsyncTransport`` sends the same requests from the event loop over one aiohttp session per
loop: the same host, CA, client certificate and bearer token (a token that can change, an exec
plugin's or an in-cluster token file's, is asked for again every few seconds, in a thread), the
same bookkeeping (the client's ``RequestLedger``: counters, observers, ``Reachability``, and the
send checks, asked as each request is handed to its connection) and the same errors
(``kube.api_error``; ``kube.is_unreachable`` knows aiohttp's). It stands behind
``transport.LoopTransport`` (resourceconsist.cluster.transport, the seam both transports share),
and the client keeps it in its ``loop_transport`` slot, which only ``for_client`` fills.

A configuration the session cannot honour (an official client's HTTP proxy or
``assert_hostname``: ``KubeClient.loop_refusal``) gets no transport: ``for_client`` answers None
and callers keep the thread path (``patch_optimistic``, ``patch`` below do that themselves).
docs/concepts.md, "The runtime".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import msgspec

from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient, KubeObject, PatchType, Resource
from resourceconsist.cluster.kubeconfig import Access
from resourceconsist.cluster.transport import RequestLedger, write_refused
from resourceconsist.flow.fence import check_fence

if TYPE_CHECKING:
    # aiohttp is imported when a transport is made: what only imports the reconcile steps (the
    # explain command, unit tests on in-memory writers) does not load it.
    import aiohttp

log = logging.getLogger(__name__)

#: How long a token from a refresh hook is used before the hook is asked again (it reads a file
#: or runs an exec plugin only when its own expiry says so; the official client asks per request).
TOKEN_REFRESH_SECONDS = 10.0
#: Connections to the API server the session keeps at most, requests beyond them waiting for
#: one: 16 in flight already take what one API server serves (docs/benchmarks.md measures its raw
#: PATCH rate with 16 clients), and each TLS connection holds asyncio's 256 KB read buffer.
CONNECTIONS = 16
#: Seconds an idle connection stays pooled (client-go's IdleConnTimeout): bursts of writes
#: seconds apart reuse their connections instead of paying a TLS handshake each time again.
IDLE_CONNECTION_SECONDS = 90.0
#: Tries of a request whose connection failed before any answer (a keep-alive connection the
#: API server closed meanwhile): urllib3 retries such requests too.
_CONNECT_TRIES = 3


class AsyncTransport:
    """One event loop's session to one API server, reporting to ``ledger`` (its client's); made
    by ``for_client``."""

    def __init__(self, access: Access, ledger: RequestLedger, loop: asyncio.AbstractEventLoop) -> None:
        import aiohttp

        self.ledger = ledger
        self.loop = loop
        self._access = access
        self._base = access.host
        self._ssl: ssl.SSLContext | bool = access.ssl_context() or False  # None: an http:// host
        self._server_hostname = access.tls_server_name
        self._token: str | None = None  # a token that can change, as last asked for
        self._token_at = float("-inf")
        self._refreshing = asyncio.Lock()  # one hook call at a time, its answer shared
        #: TCP connections opened so far (connection reuse keeps it near the parallel requests).
        self.connections_opened = 0
        connector = aiohttp.TCPConnector(
            limit=CONNECTIONS, keepalive_timeout=IDLE_CONNECTION_SECONDS, socket_factory=self._socket
        )
        self.session = aiohttp.ClientSession(
            connector=connector,
            request_class=_checked_request(ledger),
            # As the thread path, 60 s for an answer; no bound on waiting for one of the pool's
            # connections, which requests in flight free (urllib3 opened extra ones instead).
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=60.0, sock_read=60.0),
        )

    def _socket(self, addr_info: Any) -> socket.socket:
        family, type_, proto, _, _ = addr_info
        self.connections_opened += 1
        return socket.socket(family=family, type=type_, proto=proto)

    async def close(self) -> None:
        await self.session.close()

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
        import aiohttp

        ledger = self.ledger
        ledger.sent(method.lower(), path)
        url = kube.request_url(self._base, path, query)
        data = None if body is None else msgspec.json.encode(body)
        headers = await self._headers(content_type)
        started = time.monotonic()
        refreshed = not self._token_changes
        tries = 0
        while True:
            tries += 1
            try:
                async with self.session.request(
                    method,
                    url,
                    data=data,
                    headers=headers,
                    ssl=self._ssl,
                    server_hostname=self._server_hostname,
                ) as response:
                    status, reason = response.status, response.reason or ""
                    payload = await response.read()
            except (aiohttp.ClientConnectionError, TimeoutError) as err:
                refused = write_refused(method)
                if not refused and _before_any_answer(err) and tries < _CONNECT_TRIES and method != "POST":
                    continue
                ledger.unanswered(method, err, started)
                if refused:
                    # The body writer found the Lease lost and dropped the connection with
                    # nothing written (``CheckedRequest.write_bytes``): the fence's error.
                    check_fence()
                raise
            except Exception as err:  # a send check refused it, or the session failed otherwise
                ledger.unanswered(method, err, started)
                raise
            if status == 401 and not refreshed:
                # A token that expired between two refreshes: ask the hook now, once.
                refreshed = True
                headers = await self._headers(content_type, refresh=True)
                continue
            break
        ledger.answered(method, status, started)
        if status >= 400:
            raise kube.api_error(status, reason, payload, method, path)
        return kube.decode_json(payload) if payload else {}

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
        import aiohttp

        ledger = self.ledger
        path = res.path(namespace)
        ledger.sent("watch", path)
        query = kube.watch_query(resource_version, timeout_seconds)
        url = kube.request_url(self._base, path, query)
        headers = await self._headers("application/json")
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=timeout_seconds + 30.0)
        started = time.monotonic()
        try:
            response = await self.session.get(
                url, headers=headers, ssl=self._ssl, server_hostname=self._server_hostname, timeout=timeout
            )
        except Exception as err:
            ledger.unanswered("GET", err, started)
            raise
        ledger.answered("GET", response.status, started)
        try:
            if response.status >= 400:
                raise kube.api_error(
                    response.status, response.reason or "", await response.read(), "GET", path
                )
            yield _events(response)
        finally:
            response.close()


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[KubeObject]:
    # Lines split by hand: aiohttp's readline refuses a line over its buffer (a large object).
    lines = kube.Lines()
    async for chunk in response.content.iter_any():
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
    # last thing), so a session never outlives the loop it belongs to, whoever made the loop.
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


def _checked_request(ledger: RequestLedger) -> type[aiohttp.ClientRequest]:
    """aiohttp's request, asking ``ledger``'s send checks as it is handed its connection: its
    ``send`` writes the request to that connection before it first yields, so no ``await`` lies
    between the check and the send (resourceconsist.cluster.transport, "The send hook")."""
    import aiohttp

    class CheckedRequest(aiohttp.ClientRequest):
        async def send(self, conn: Any) -> aiohttp.ClientResponse:
            ledger.before_send(self.method, self.url.raw_path)
            return await super().send(conn)

        async def write_bytes(self, writer: Any, conn: Any, *args: Any, **kwargs: Any) -> None:
            # A request with a body, headers included, is written here, in a task of its own
            # that Python 3.11 starts only after the loop's other ready work: the fence is asked
            # again in the step that writes. Refused, the connection is dropped with nothing
            # written, and ``AsyncTransport.request`` raises the fence's ``LeaseLost``
            # (resourceconsist.cluster.transport, "The send hook").
            if write_refused(self.method):
                conn.close()
                return
            await super().write_bytes(writer, conn, *args, **kwargs)

    return CheckedRequest


def _before_any_answer(err: BaseException) -> bool:
    """A connection that broke (refused, reset, closed while idle in the pool): resending is
    safe for the requests this transport sends but POST (reads, and patches that either carry a
    resourceVersion precondition or set the same fields again)."""
    import aiohttp

    return isinstance(
        err, aiohttp.ServerDisconnectedError | aiohttp.ClientConnectorError | aiohttp.ClientOSError
    )
