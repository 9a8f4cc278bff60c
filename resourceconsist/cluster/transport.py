"""The seam between ``KubeClient`` and the ways its requests reach the API server.

A ``KubeClient`` (resourceconsist.cluster.kube) has two transports: its ``ThreadTransport``
(urllib3, blocking, in the caller's thread) and, per event loop, an ``AsyncTransport``
(resourceconsist.cluster.aiokube: HTTP/1.1 on asyncio, for the hot path's writes). Each stands behind one of
the two protocols here, ``BlockingTransport`` and ``LoopTransport``, and neither knows the other
or the client's insides. What they share is what the client hands them:

- its ``Access`` (resourceconsist.cluster.kubeconfig): where the API server is, how to check it,
  how to authenticate;
- its ``RequestLedger``, to which every transport reports every request, in this order:
  ``sent`` when the request starts (the per-verb counts that prove steady state writes nothing),
  ``before_send`` in the send step itself (the hook below), then ``answered`` (any HTTP answer) or
  ``unanswered`` (none: refused, reset, timed out, TLS failed), and ``conflicted`` for each 409 the
  optimistic-concurrency loop retries. The observers (the manager's ``rest_client_*`` series,
  docs/observability.md) and the outage log (``Reachability``) hang off the ledger, so both
  transports feed them alike;
- ``kube.api_error`` to turn a non-2xx answer into the client's errors, and
  ``kube.precondition_steps``, the one conflict loop both drive.

**The send hook.** ``RequestLedger.before_send(method, path)`` runs the ledger's send checks
(``add_send_check``) in the same synchronous step that hands the request to a connection: in the
thread transport once urllib3 holds a connected socket (``HTTPConnectionPool._validate_conn``,
"called right before a request is made, after the socket is created"), directly followed by the
connection's ``request``; in the loop transport once its pool hands it a connection, directly
followed by ``http1.Connection.send``, which writes the whole request to that connection in the
same call (resourceconsist/cluster/http1.py). No ``await`` and no thread hand-off lies between a
check and its send, on every Python version, and a check runs again for every attempt of a
request (a retry after a broken connection). A check that raises refuses the request: nothing of
it is written, and its exception reaches the caller (the ledger records the request as
unanswered). The lease fence is checked here, after the send checks (the last step before the
write), for every request but a read: a write made for a Lease no longer surely held is never
sent (docs/concepts.md, "Fencing"). A pause that falls between a check and the write of the same
synchronous step is the one case left: the write goes out on resuming, and its answer, after the
deadline, logs a warning (``RequestLedger.answered``; docs/concepts.md, "Fencing", "What remains
possible").
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from resourceconsist.flow.fence import check_fence, fence_lost

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger(__name__)

#: Methods that change nothing: never fenced.
_READS = frozenset({"GET", "HEAD", "OPTIONS"})

#: Told of every request: its HTTP method, the answer's status (0: no answer), its seconds.
RequestObserver = Callable[[str, int, float], None]
#: Asked right before a request is handed to a connection, with its HTTP method and path;
#: raising refuses it (``RequestLedger.add_send_check``).
SendCheck = Callable[[str, str], None]
#: Turns an answer's JSON bytes (a whole body, or one line of a watch) into objects.
Decode = Callable[[bytes], Any]


class Reachability:
    """Whether the API server answers, logged once per change (down, back) rather than per call.

    During an outage every reconcile and every watch fails the same way; one WARNING when the
    first request fails and one INFO when a request is answered again say all there is to say
    (docs/concepts.md, "What an operator sees under faults").
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._down_since: float | None = None
        #: Outages seen so far.
        self.outages = 0

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, err: BaseException) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
            self.outages += 1
        log.warning("%s unreachable: %s; retrying until it answers", self.name, first_line(err))

    def answered(self) -> None:
        if self._down_since is None:  # the common case, without taking the lock
            return
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            log.info("%s reachable again after %.1fs", self.name, time.monotonic() - since)


def first_line(err: BaseException) -> str:
    """The first line of an error's text (its type's name when it has none), at most 300 characters."""
    text = str(err) or type(err).__name__
    return text.splitlines()[0][:300]


class RequestLedger:
    """The bookkeeping of one client's requests, whichever transport sends them; thread-safe.

    A ``KubeClient`` owns one (``client.ledger``) and hands it to its transports, which report
    each request to it (the module's docstring gives the order). ``unreachable`` says which
    errors mean the API server gave no answer at all (the client's ``kube.is_unreachable``).
    """

    def __init__(self, name: str, unreachable: Callable[[BaseException], bool]) -> None:
        #: Requests by verb: ``get``, ``post``, ``put``, ``patch``, ``delete``, ``watch``.
        self.requests: Counter[str] = Counter()
        #: Requests by ``"<verb> <resource>"`` (e.g. ``"patch pods"``), for tests and benchmarks.
        self.requests_by_resource: Counter[str] = Counter()
        #: 409 Conflicts the optimistic-concurrency loop met, by resource (exported as a metric).
        self.conflicts: Counter[str] = Counter()
        #: Whether the API server answers (logged once per outage).
        self.reachability = Reachability(name or "API server")
        self._unreachable = unreachable
        self._lock = threading.Lock()
        self._observers: tuple[RequestObserver, ...] = ()
        self._checks: tuple[SendCheck, ...] = ()

    # -- what the transports report ------------------------------------------------------------

    def sent(self, verb: str, path: str) -> None:
        """A request starts: counted by ``verb`` (an HTTP method in lower case, or ``watch``) and
        by the resource ``path`` addresses."""
        with self._lock:
            self.requests[verb] += 1
            self.requests_by_resource[f"{verb} {resource_of(path)}"] += 1

    def before_send(self, method: str, path: str) -> None:
        """The request is about to be handed to a connection (the send hook, module docstring):
        every send check is asked, and one that raises refuses it; then, the last step before the
        write, a write made for a Lease no longer surely held is refused (``LeaseLost``; the lease
        fence, resourceconsist/flow/fence.py: docs/concepts.md, "Fencing")."""
        for check in self._checks:
            check(method, path)
        if method not in _READS:
            check_fence()

    def answered(self, method: str, path: str, status: int, started: float) -> None:
        """An HTTP answer with ``status`` came, ``started`` being the request's ``time.monotonic()``.

        A write answered after the deadline of the Lease it was made for passed its fence check
        before the deadline (or it would not have been sent) and may have reached the API server
        after it: the process paused between the check and the write, or the answer was slow. It
        is logged as a warning, the one trace of the case the fence cannot close (docs/concepts.md,
        "Fencing", "What remains possible")."""
        self._observed(method, status, started)
        self.reachability.answered()
        if method not in _READS and fence_lost():
            log.warning(
                "%s %s (answered %d) was sent for a Lease whose deadline has passed since its fence "
                "check: it may have reached the API server after another replica took the Lease over",
                method,
                path,
                status,
            )

    def unanswered(self, method: str, err: BaseException, started: float) -> None:
        """No answer came: ``err`` is why."""
        self._observed(method, 0, started)
        if self._unreachable(err):
            self.reachability.failed(err)

    def conflicted(self, plural: str) -> None:
        """The optimistic-concurrency loop met a 409 Conflict on a ``plural`` and reads again."""
        with self._lock:
            self.conflicts[plural] += 1

    # -- who listens, and who may refuse --------------------------------------------------------

    def observe(self, observer: RequestObserver) -> Callable[[], None]:
        """Tell ``observer`` of every request from now on (watches when their answer starts);
        returns what stops it."""
        with self._lock:
            self._observers = (*self._observers, observer)

        def stop() -> None:
            with self._lock:
                self._observers = tuple(o for o in self._observers if o is not observer)

        return stop

    def add_send_check(self, check: SendCheck) -> Callable[[], None]:
        """Ask ``check`` before every request of the client is handed to a connection, from now
        on; returns what removes it. It runs in the send step (no ``await``, no thread hand-off
        before the send), so it must be quick and must not block."""
        with self._lock:
            self._checks = (*self._checks, check)

        def remove() -> None:
            with self._lock:
                self._checks = tuple(c for c in self._checks if c is not check)

        return remove

    def _observed(self, method: str, status: int, started: float) -> None:
        seconds = time.monotonic() - started
        for observer in self._observers:
            observer(method, status, seconds)


def resource_of(path: str) -> str:
    """The resource (plural) a request path addresses: ``/api/v1/namespaces/n/pods/p`` -> ``pods``."""
    # Counted for every request: no list built beyond the split.
    parts = path.strip("/").split("/")
    at = 2 if parts[0] == "api" else 3
    if len(parts) > at + 2 and parts[at] == "namespaces":
        at += 2
    return parts[at] if len(parts) > at else ""


class BlockingTransport(Protocol):
    """How a client's requests reach its API server from the caller's thread (``KubeClient``'s
    own: ``kube.ThreadTransport``). It reports each request to the client's ``RequestLedger``."""

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] | None = 60.0,
        stream: bool = False,
        decode: Decode | None = None,
    ) -> Any:
        """Send one request; its decoded JSON answer (an open streamed answer with ``stream``).
        A non-2xx answer raises ``kube.ApiError``'s subclass for its status."""

    def close(self) -> None:
        """Let go of its connections."""


class LoopTransport(Protocol):
    """How a client's requests reach its API server from one event loop
    (``aiokube.AsyncTransport``); the same reports to the same ledger, the same errors."""

    loop: asyncio.AbstractEventLoop

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """Send one request from the loop; its decoded JSON answer."""

    async def close(self) -> None:
        """Close its session."""


@dataclass
class LoopTransportSlot:
    """Where a client keeps its event-loop transport (``client.loop_transport``): made on first
    use in a loop by ``aiokube.for_client``, which alone fills this slot, and kept here so the
    transport lives as long as its client. A client serves one loop at a time: a request from
    another loop replaces the transport."""

    #: The transport of the loop that made it last; None: none made yet.
    transport: LoopTransport | None = None
    #: What closes the transport when its loop shuts down (the loop holds it weakly, so the
    #: slot keeps it alive).
    closer: object = None
    #: The client's configuration keeps its requests on threads (``KubeClient.loop_refusal``),
    #: and that has been logged.
    refusal_logged: bool = False

    def serving(self, loop: asyncio.AbstractEventLoop) -> LoopTransport | None:
        """The transport made for ``loop``, if it is the one kept."""
        transport = self.transport
        return transport if transport is not None and transport.loop is loop else None

    def keep(self, transport: LoopTransport, closer: object) -> None:
        """Keep ``transport`` (for its loop) and what closes it."""
        self.transport, self.closer = transport, closer
