"""The webhook's listener: TCP accept, TLS only once a client speaks, and a deadline on every
phase of a connection.

Why it exists (docs/webhook.md, "Connections and memory"): asyncio's TLS server transport
allocates its TLS state and a zero-filled 256 KiB read buffer the moment a TCP connection is
accepted, before a byte arrives. Port scanners and TCP health checks open and close
connections by the thousand; on Python 3.11.7 and 3.12.1 each aborted handshake also leaves a
reference cycle (CPython gh-109534) that only a full garbage collection frees, so hundreds of
those buffers pile up, and glibc keeps the heap they were carved from: RSS grew by ~200 KiB
per connect/close and never came back. Here a connection costs a socket until its first byte
arrives; only then does it get TLS (``loop.connect_accepted_socket``), and a failed handshake's
traceback is dropped at once so nothing waits for the collector. After a burst of real TLS
connections, the cycles closed transports leave are collected and what that frees inside
glibc's heap is handed back to the system (``malloc_trim``), rather than kept for ever.

Every phase has a deadline, so a stalled peer cannot hold a connection:

- ``handshake_timeout``: from accept to an established TLS session (waiting for the first
  byte included);
- ``header_timeout``: from the session (or the first byte of a later request) to the complete
  request headers;
- ``body_timeout``: for reading the body, enforced by the handler (it answers 408);
- ``idle_timeout``: between requests on a kept-alive connection.

``max_connections`` caps open connections; at the cap the listener stops accepting (the
kernel's backlog holds the rest), as Go's ``netutil.LimitListener`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import enum
import errno
import gc
import logging
import platform
import socket
import ssl
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

from resourceconsist.webhook.options import ConnectionLimits

log = logging.getLogger("resourceconsist.webhook")

#: accept() errors that mean "out of resources for now", not "the listener is broken".
_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


#: Closed TLS connections that make a heap trim worth it, and how long after the one that
#: reaches that count the trim runs (so it runs at most once a second, late in a burst).
_TRIM_AFTER_CLOSED: Final = 32
_TRIM_DELAY: Final = 1.0


def _libc_malloc_trim() -> Callable[[int], int] | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_MALLOC_TRIM: Final = _libc_malloc_trim()


@dataclass
class ConnectionStats:
    """What the listener did, for tests, benchmarks and debugging."""

    accepted: int = 0
    #: Closed by the peer before sending a byte (TCP health checks, port scanners).
    closed_before_tls: int = 0
    handshake_failures: int = 0
    handshake_timeouts: int = 0
    header_timeouts: int = 0
    #: Counted by the request handler, which enforces the body deadline.
    body_timeouts: int = 0
    idle_timeouts: int = 0
    open: int = 0
    peak_open: int = 0
    heap_trims: int = 0


class _Phase(enum.Enum):
    HEADERS = "request headers"
    BUSY = "request"
    IDLE = "idle keep-alive"


_NOT_CONNECTED: Final = asyncio.Protocol()


class _Guard(asyncio.Protocol):
    """Wraps the HTTP protocol of one TLS connection and closes it when a phase overruns."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], listener: Listener) -> None:
        self._factory = factory
        #: The HTTP protocol, made once TLS is up: a handshake that fails never builds one
        #: (aiohttp's holds a reference cycle with its parser, which only the collector frees).
        self.inner: asyncio.Protocol = _NOT_CONNECTED
        self._listener = listener
        self._transport: asyncio.Transport | None = None
        self._phase = _Phase.HEADERS
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol, delegated ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though not always asyncio's class: uvloop's are their own
        # (docs/reference/options.md, "The event loop").
        self._transport = cast(asyncio.Transport, transport)
        self.inner = self._factory()
        self._listener.guards[self.inner] = self
        self.inner.connection_made(transport)
        self._arm(self._listener.limits.header_timeout)

    def data_received(self, data: bytes) -> None:
        if self._phase is _Phase.IDLE:
            # A new request begins: its headers get their own deadline from this first byte.
            self._phase = _Phase.HEADERS
            self._arm(self._listener.limits.header_timeout)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        self._listener.guards.pop(self.inner, None)
        self._transport = None
        try:
            self.inner.connection_lost(exc)
        finally:
            self._listener.release(tls=True)

    # -- phases (called by the server's middleware) ---------------------------------------------

    def request_started(self) -> None:
        self._phase = _Phase.BUSY
        self._cancel()

    def request_finished(self) -> None:
        if self._transport is None or self._phase is not _Phase.BUSY:
            return
        self._phase = _Phase.IDLE
        self._arm(self._listener.limits.idle_timeout)

    def _arm(self, seconds: float) -> None:
        self._cancel()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expired, self._phase, seconds)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, phase: _Phase, seconds: float) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or phase is not self._phase:
            return
        stats = self._listener.stats
        if phase is _Phase.IDLE:
            stats.idle_timeouts += 1
        else:
            stats.header_timeouts += 1
        log.debug(
            "webhook closes the connection from %s: no %s within %.0fs",
            _peer(transport.get_extra_info("peername")),
            "further request" if phase is _Phase.IDLE else "complete request headers",
            seconds,
        )
        # abort, not close: a graceful TLS close would wait for a peer that is not listening.
        transport.abort()


def _peer(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


def _drop_traceback(err: BaseException) -> None:
    """Free what a failed handshake's exception holds now, not at the next full collection: on
    Python 3.11.7 and 3.12.1 its traceback's frames keep the TLS protocol, its buffer and its
    socket in a reference cycle (CPython gh-109534), and the handshake's future keeps its own
    reference to that traceback, so the frames' locals are cleared, not just the reference."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current.__traceback__ = None
        current = current.__cause__ or current.__context__


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _first_byte(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bool:
    """Wait until ``conn`` is readable; True when it has data (left unread), False at EOF."""
    fd = conn.fileno()
    while True:
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _resolve, ready)
        try:
            await ready
        finally:
            loop.remove_reader(fd)
        try:
            return bool(conn.recv(1, socket.MSG_PEEK))
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            return False


def listening_sockets(host: str | None, port: int, backlog: int) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for ``host`` (None: every interface, IPv4 and IPv6
    when the machine has both) and ``port`` (0: one free port, shared by all)."""
    if host is None:
        if socket.has_dualstack_ipv6():
            addresses: list[tuple[socket.AddressFamily, Any]] = [(socket.AF_INET6, ("::", port))]
            dualstack = True
        else:
            addresses, dualstack = [(socket.AF_INET, ("0.0.0.0", port))], False
    else:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        addresses = list(dict.fromkeys((family, address[:2]) for family, _, _, _, address in infos))
        dualstack = False
    sockets: list[socket.socket] = []
    try:
        for family, (address, wanted) in addresses:
            # With port 0 the first socket picks a free port; the others take the same.
            bound = sockets[0].getsockname()[1] if sockets and wanted == 0 else wanted
            sock = socket.create_server(
                (address, bound), family=family, backlog=backlog, dualstack_ipv6=dualstack
            )
            sock.setblocking(False)
            sockets.append(sock)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class Listener:
    """Accepts connections on ``sockets`` and hands each, once TLS is up, to a protocol from
    ``protocol_factory`` (aiohttp's server), guarded by ``limits``."""

    def __init__(
        self,
        sockets: list[socket.socket],
        protocol_factory: Callable[[], asyncio.Protocol],
        ssl_context: ssl.SSLContext,
        limits: ConnectionLimits,
    ) -> None:
        self.sockets = sockets
        self.limits = limits
        self.stats = ConnectionStats()
        #: The guard of each open TLS connection, by its HTTP protocol (for the middleware).
        self.guards: dict[object, _Guard] = {}
        self._factory = protocol_factory
        self._ssl = ssl_context
        self._slots = asyncio.Semaphore(limits.max_connections)
        self._accepting: list[asyncio.Task[None]] = []
        self._opening: set[asyncio.Task[None]] = set()
        self._closed_since_trim = 0
        self._trim: asyncio.TimerHandle | None = None
        self._stopped = False

    @property
    def port(self) -> int:
        return int(self.sockets[0].getsockname()[1])

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._accepting = [
            loop.create_task(self._accept(sock), name=f"webhook-accept-{sock.getsockname()[0]}")
            for sock in self.sockets
        ]

    async def stop(self) -> None:
        """Stop accepting and drop connections still before TLS; open TLS connections are the
        HTTP server's to shut down."""
        self._stopped = True
        tasks = [*self._accepting, *self._opening]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._accepting = []
        for sock in self.sockets:
            sock.close()
        if self._trim is not None:
            self._trim.cancel()
            self._trim = None

    def release(self, *, tls: bool) -> None:
        """A connection is gone; ``tls`` when it had TLS state (a handshake was attempted)."""
        self.stats.open -= 1
        self._slots.release()
        if tls and _MALLOC_TRIM is not None and not self._stopped:
            self._closed_since_trim += 1
            if self._closed_since_trim >= _TRIM_AFTER_CLOSED and self._trim is None:
                self._trim = asyncio.get_running_loop().call_later(_TRIM_DELAY, self._trim_heap)

    def _trim_heap(self) -> None:
        self._trim = None
        self._closed_since_trim = 0
        self.stats.heap_trims += 1
        # Every closed asyncio socket transport stays in a small reference cycle (it holds a
        # bound method of itself) until a collection; after a burst, thousands of them would
        # wait for the next full one, keeping their memory. Collected here, once per burst.
        gc.collect()
        # TLS buffers freed in the middle of the heap stay resident until trimmed; glibc only
        # trims the top of the heap by itself. The walk takes milliseconds: off the loop.
        assert _MALLOC_TRIM is not None
        asyncio.get_running_loop().run_in_executor(None, _MALLOC_TRIM, 0)

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._slots.acquire()
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as err:
                self._slots.release()
                if err.errno in _RESOURCE_ERRNOS:
                    log.warning("webhook cannot accept connections (%s); retrying in 1s", err)
                    await asyncio.sleep(1.0)
                # Anything else (e.g. ECONNABORTED) concerns that one connection only.
                continue
            except BaseException:
                self._slots.release()
                raise
            stats = self.stats
            stats.accepted += 1
            stats.open += 1
            stats.peak_open = max(stats.peak_open, stats.open)
            task = loop.create_task(self._open(conn))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)

    async def _open(self, conn: socket.socket) -> None:
        """Wait for the client's first byte, then the TLS handshake, within the handshake
        timeout; on success the connection belongs to its guard (which releases the slot)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.handshake_timeout
        try:
            peer = _peer(conn.getpeername())
        except OSError:  # already reset by the peer
            peer = "?"
        handed_over = tls = False
        try:
            conn.setblocking(False)
            async with asyncio.timeout_at(deadline):
                spoke = await _first_byte(loop, conn)
            if not spoke:
                self.stats.closed_before_tls += 1
                return
            tls = True
            await loop.connect_accepted_socket(
                lambda: _Guard(self._factory, self),
                conn,
                ssl=self._ssl,
                ssl_handshake_timeout=max(deadline - loop.time(), 0.001),
            )
            handed_over = True
        except TimeoutError:
            self.stats.handshake_timeouts += 1
            log.debug(
                "webhook closes the connection from %s: no TLS handshake within %.0fs",
                peer,
                self.limits.handshake_timeout,
            )
        except OSError as err:  # ssl.SSLError, resets, and asyncio's handshake timeout
            if isinstance(err, ConnectionAbortedError) and loop.time() >= deadline:
                self.stats.handshake_timeouts += 1
            else:
                self.stats.handshake_failures += 1
            log.debug("webhook TLS handshake with %s failed: %s", peer, err)
            _drop_traceback(err)
        finally:
            if not handed_over:
                conn.close()
                self.release(tls=tls)
