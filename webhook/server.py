"""The admission webhook server: HTTPS (aiohttp), one path per webhook adapter, health and readiness.

``WebhookServer`` serves every registered adapter at ``/mutating-<name>`` on one TLS port and
answers ``admission.k8s.io/v1`` AdmissionReviews. This module is the HTTP side (reading the
body, the deadline of the adapter call, the answer, the log line and the observer); what a review
gets is decided by ``admission.decide``:

- Pod CREATE: the adapter names the pod's employers (from the informer cache); the answer is a
  JSONPatch merging their entries into ``pod.kusionstack.io/available-conditions``, keeping
  the entries already there (computed by ``resourceconsist.rules.lifecycle``).
- dry-run requests, other kinds, subresources and other operations: allowed untouched.
- a body that is not a v1 AdmissionReview (not JSON, not an object, wrong apiVersion or kind,
  no request or uid, a field of the wrong type, too large, wrong Content-Type): HTTP 400 with a
  ``metav1.Status`` saying why.
- a pod whose fields the webhook reads have the wrong shape, or whose existing annotation is
  malformed (400, naming the field by its path), an adapter that fails (500) or does not answer
  in time (504): an AdmissionReview with ``allowed: false`` and that message, so the user
  creating the pod sees the cause. The adapter call is bounded by ``adapter_timeout`` and by
  the API server's own ``?timeout=`` for the call, whichever is shorter, so the server answers
  before the API server gives up. No input gets an HTTP 5xx (docs/webhook.md, "Bad input").

Connections come through ``listener.Listener``: TLS starts on the client's first byte, and the
handshake, the request headers, the body and idle keep-alive each have a deadline, with a cap on
open connections (``ConnectionLimits``; docs/webhook.md, "Connections and memory").

It runs on the caller's event loop (the manager's), alongside controllers; ``serve`` is the
entry point that starts it. Its settings are one frozen ``WebhookOptions`` (``options``; controller-runtime's
``webhook.Options``; docs/reference/options.md): where it listens, its deadlines and limits, and
its ``BootstrapOptions``, with which it makes its certificate first (and, with ``webhook_url``,
registers a URL-based configuration for a server outside the cluster). ``/healthz`` answers while
the loop serves; ``/readyz`` once a certificate is loaded and the adapters' caches are synced.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web
from aiohttp.typedefs import Handler

from resourceconsist.cluster.cache import CacheReader, InformerFactory
from resourceconsist.cluster.certwatcher import CertificateReloader
from resourceconsist.cluster.kube import KubeClient, KubeObject, Resource
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.reconcile.profile import WebhookProfile
from resourceconsist.webhook.adapter import (
    PATH_PREFIX,
    EmployerRef,
    WebhookAdapter,
    validate_adapter_name,
    webhook_path,
)
from resourceconsist.webhook.admission import (
    AdapterTimeout,
    BadReview,
    Outcome,
    Verdict,
    decide,
    display_name,
    error_text,
    parse_review,
    review_response,
    status_body,
)
from resourceconsist.webhook.bootstrap import (
    TLS_CERT_FILE,
    TLS_KEY_FILE,
    BootstrapResult,
    ensure_webhook_certificates,
    register_url_webhooks,
)
from resourceconsist.webhook.listener import ConnectionStats, Listener, listening_sockets
from resourceconsist.webhook.options import WebhookOptions

if TYPE_CHECKING:
    from resourceconsist.runtime.metrics import Metrics

log = logging.getLogger("resourceconsist.webhook")

#: Share of the API server's ``?timeout=`` the adapter may use; the rest is for the answer.
_CALLER_TIMEOUT_SHARE: Final = 0.8
_GO_SECONDS = re.compile(r"^(\d+(?:\.\d+)?)s$")


@dataclass(frozen=True)
class AdmissionDecision:
    """One answered AdmissionReview, as logged and as given to the ``observer``."""

    path: str
    uid: str
    kind: str
    operation: str
    namespace: str
    #: The pod's name, or ``<generateName>*`` when the API server has not named it yet.
    name: str
    dry_run: bool
    allowed: bool
    code: int
    message: str
    patch: tuple[dict[str, Any], ...] = ()
    employers: tuple[EmployerRef, ...] = ()
    seconds: float = 0.0


Observer = Callable[[AdmissionDecision], None]


def _caller_timeout(query: Mapping[str, str]) -> float | None:
    """The API server's ``?timeout=10s`` (a Go duration in seconds), if present."""
    match = _GO_SECONDS.match(query.get("timeout", ""))
    return float(match.group(1)) if match else None


class WebhookServer:
    """Serves the webhook adapters over HTTPS on the running event loop, as ``options`` say
    (default ``WebhookOptions()``).

    ``informers`` is the shared informer factory the adapters read through, and its client the
    one the certificate bootstrap writes with; the server makes sure the informers of the
    resources the adapters declare exist, and starts and stops the factory itself only when
    ``own_informers`` is true (a manager that shares its factory with controllers starts it
    once for all). ``observer`` is given every ``AdmissionDecision``.
    """

    def __init__(
        self,
        adapters: Iterable[WebhookAdapter] = (),
        options: WebhookOptions | None = None,
        *,
        informers: InformerFactory,
        own_informers: bool = False,
        observer: Observer | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        #: The settings this server runs with.
        self.options = options if options is not None else WebhookOptions()
        #: Where the adapters' paths report controller-runtime's webhook series (the manager's).
        self.metrics = metrics
        self._informers = informers
        self._reader: CacheReader = informers.reader()
        self._own_informers = own_informers
        self._adapters: dict[str, WebhookAdapter] = {}
        #: The resources each adapter reads through the caches (its profile's), by name.
        self._cached: dict[str, tuple[Resource, ...]] = {}
        #: The port listened on: ``options.port``, or the one picked for port 0 once started.
        self.port = self.options.port
        self.observer = observer
        self.last_bootstrap: BootstrapResult | None = None
        self.bad_requests = 0
        cert_dir = self.options.cert_dir
        self._tls = CertificateReloader(
            cert_dir / TLS_CERT_FILE,
            cert_dir / TLS_KEY_FILE,
            interval=self.options.cert_reload_interval,
            # controller-runtime's certwatcher series (docs/observability.md).
            on_read=metrics.standard.certificate_read if metrics is not None else None,
        )
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None
        self._bootstrap_task: asyncio.Task[None] | None = None
        for adapter in adapters:
            self.add_adapter(adapter)

    # -- adapters ----------------------------------------------------------------------------

    def add_adapter(self, adapter: WebhookAdapter) -> str:
        """Serve ``adapter`` at ``/mutating-<name>`` (also while running); returns the path."""
        name = validate_adapter_name(adapter.name)
        if name in self._adapters:
            raise ValueError(f"a webhook adapter named {name!r} is already registered")
        profile = WebhookProfile.of(adapter)
        try:
            # Pods are cached lean (docs/tutorial.md, "Fields the cache keeps").
            self._informers.keep_pod_fields(profile.pod_fields)
        except ValueError as err:
            raise ValueError(f"webhook adapter {name}: get_cached_pod_fields: {err}") from err
        for resource in profile.cached_resources:
            # Creating the informer starts it when the factory runs, so the cache fills
            # before the first admission needs it.
            self._informers.informer(resource)
        self._adapters[name] = adapter
        self._cached[name] = profile.cached_resources
        log.info("webhook adapter %s registered at %s", name, webhook_path(name))
        return webhook_path(name)

    def remove_adapter(self, name: str) -> None:
        """Stop serving the adapter ``name``; its path answers 404 from then on."""
        self._cached.pop(name, None)
        if self._adapters.pop(name, None) is not None:
            log.info("webhook adapter %s removed", name)

    @property
    def adapters(self) -> Mapping[str, WebhookAdapter]:
        return dict(self._adapters)

    @property
    def paths(self) -> tuple[str, ...]:
        """The URL paths served now, one per adapter."""
        return tuple(webhook_path(name) for name in sorted(self._adapters))

    # -- life cycle -----------------------------------------------------------------------------

    @property
    def reader(self) -> CacheReader:
        """The cache-backed reader the adapters are given."""
        return self._reader

    @property
    def tls(self) -> CertificateReloader:
        return self._tls

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def connections(self) -> ConnectionStats:
        """What the listener did so far (accepted, timed out, open)."""
        if self._listener is None:
            return ConnectionStats()
        return self._listener.stats

    def _app(self) -> web.Application:
        middlewares = [self._track_phase] if self.metrics is None else [self._track_phase, self._measure]
        app = web.Application(client_max_size=self.options.max_body_bytes, middlewares=middlewares)
        app.router.add_post(PATH_PREFIX + "{name}", self._admit)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        return app

    @web.middleware
    async def _track_phase(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # The headers are in once a handler runs: the connection's header deadline ends here,
        # and its idle deadline starts when the answer is given (webhook/listener.py).
        listener = self._listener
        guard = listener.guards.get(request.protocol) if listener is not None else None
        if guard is not None:
            guard.request_started()
        try:
            return await handler(request)
        finally:
            if guard is not None:
                guard.request_finished()

    @web.middleware
    async def _measure(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # controller-runtime's webhook series, for the adapters' paths only: a stray path must
        # not make a series of its own (docs/observability.md).
        if self.metrics is None or request.match_info.get("name") not in self._adapters:
            return await handler(request)
        series = self.metrics.standard.webhook(request.path)
        series.in_flight.inc()
        started = time.monotonic()
        status: int = HTTPStatus.INTERNAL_SERVER_ERROR
        try:
            response = await handler(request)
            status = response.status
            return response
        finally:
            series.in_flight.dec()
            series.answered(status, time.monotonic() - started)

    async def start(self) -> None:
        """Bootstrap certificates (if configured), load the certificate, start listening."""
        if self._runner is not None:
            return
        options = self.options
        if options.bootstrap is not None:
            await self.run_bootstrap()
        await asyncio.to_thread(self._tls.load)  # raises when there is no usable certificate
        self._tls.start()  # follow the files from now on
        if self._own_informers:
            self._informers.start(asyncio.get_running_loop())
        runner = web.AppRunner(
            self._app(),
            access_log=None,
            shutdown_timeout=options.shutdown_timeout,
            # aiohttp's own idle timer is only a backstop: the listener's fires first and counts.
            keepalive_timeout=options.limits.idle_timeout + 1.0,
        )
        await runner.setup()
        try:
            server = runner.server
            assert server is not None  # set by setup()
            listener = Listener(
                listening_sockets(options.host, self.port, options.backlog),
                server,
                self._tls.listener_context,
                options.limits,
            )
        except BaseException:
            await runner.cleanup()
            await self._tls.stop()
            if self._own_informers:
                await asyncio.to_thread(self._informers.stop)
            raise
        listener.start()
        self._runner, self._listener = runner, listener
        self.port = listener.port
        if options.bootstrap is not None and options.bootstrap.interval:
            self._bootstrap_task = asyncio.get_running_loop().create_task(
                self._bootstrap_loop(options.bootstrap.interval), name="webhook-cert-bootstrap"
            )
        log.info("webhook server listening on port %d, paths %s", self.port, ", ".join(self.paths) or "-")

    async def stop(self) -> None:
        """Stop listening, letting admissions in flight finish within ``shutdown_timeout``."""
        task, self._bootstrap_task = self._bootstrap_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.stop()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        await self._tls.stop()
        if self._own_informers:
            await asyncio.to_thread(self._informers.stop)
        log.info("webhook server stopped")

    async def __aenter__(self) -> WebhookServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def run_bootstrap(self) -> BootstrapResult:
        """Ensure the Secret, caBundles and cert files now (the reloader picks changes up)."""
        bootstrap = self.options.bootstrap
        if bootstrap is None:
            raise RuntimeError("this server has no bootstrap options (WebhookOptions.bootstrap is None)")
        client = self._informers.client
        # The frame's own API writes run in its own pool, never the adapters'
        # (resourceconsist.flow.cancellation).
        self.last_bootstrap = await asyncio.to_thread(
            ensure_webhook_certificates, client, self.options.cert_dir, bootstrap
        )
        if bootstrap.webhook_url is not None:
            await asyncio.to_thread(
                register_url_webhooks,
                client,
                bootstrap.webhook_url,
                sorted(self._adapters),
                self.last_bootstrap.certificates.ca_bundle,
            )
        return self.last_bootstrap

    async def _bootstrap_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.run_bootstrap()
            except Exception:
                log.warning("re-checking the webhook certificates failed", exc_info=True)

    # -- readiness --------------------------------------------------------------------------

    def not_ready_reasons(self) -> list[str]:
        """Why the server is not ready; empty when it is."""
        reasons = []
        if self._runner is None:
            reasons.append("not listening")
        if not self._tls.loaded:
            reasons.append("no certificate loaded")
        for name, resources in self._cached.items():
            for resource in resources:
                if not self._informers.informer(resource).has_synced:
                    reasons.append(f"cache of {resource.plural} not synced (adapter {name})")
        return reasons

    @property
    def ready(self) -> bool:
        return not self.not_ready_reasons()

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until ``ready``; ``TimeoutError`` naming what is missing otherwise."""
        deadline = time.monotonic() + timeout
        while not self.ready:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"webhook server not ready after {timeout:.0f}s: {self.not_ready_reasons()}"
                )
            await asyncio.sleep(0.05)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, request: web.Request) -> web.Response:
        reasons = self.not_ready_reasons()
        if reasons:
            return web.Response(status=HTTPStatus.SERVICE_UNAVAILABLE, text="; ".join(reasons))
        return web.Response(text="ok")

    # -- admission --------------------------------------------------------------------------

    def _bad_request(self, request: web.Request, code: int, message: str) -> web.Response:
        self.bad_requests += 1
        log.warning(
            "webhook %s: HTTP %d for a request from %s: %s", request.path, code, request.remote, message
        )
        return web.json_response(status_body(code, message), status=code, dumps=_compact)

    async def _admit(self, request: web.Request) -> web.Response:
        started = time.monotonic()
        name = request.match_info["name"]
        adapter = self._adapters.get(name)
        if adapter is None:
            served = ", ".join(self.paths) or "none"
            return self._bad_request(
                request,
                HTTPStatus.NOT_FOUND,
                f"no webhook adapter is served at {request.path} (served: {served})",
            )
        if request.content_type != "application/json":
            return self._bad_request(
                request,
                HTTPStatus.BAD_REQUEST,
                f"Content-Type must be application/json, not {request.content_type}",
            )
        too_large = f"the body exceeds the limit of {self.options.max_body_bytes} bytes"
        if request.content_length is not None and request.content_length > self.options.max_body_bytes:
            return self._bad_request(request, HTTPStatus.BAD_REQUEST, too_large)
        try:
            async with asyncio.timeout(self.options.limits.body_timeout):
                body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._bad_request(request, HTTPStatus.BAD_REQUEST, too_large)
        except TimeoutError:
            self.connections.body_timeouts += 1
            log.info(
                "webhook %s: closing the connection from %s: no complete body within %.0fs",
                request.path,
                request.remote,
                self.options.limits.body_timeout,
            )
            return _abort(request)
        except ConnectionError:
            # The client went away mid-body: its business, not a server error.
            log.info(
                "webhook %s: the client %s disconnected while sending the body", request.path, request.remote
            )
            return _abort(request)
        try:
            review = parse_review(body)
        except BadReview as err:
            return self._bad_request(request, HTTPStatus.BAD_REQUEST, str(err))

        req = review.request
        limit = self.options.adapter_timeout
        caller = _caller_timeout(request.query)
        if caller is not None:
            limit = min(limit, caller * _CALLER_TIMEOUT_SHARE)
        try:
            outcome = await decide(
                req,
                adapter.name,
                lambda pod: self._employers(adapter, pod, limit),
                limit,
                self.options.drain_waiter,
                employer_label=self.options.pod_employer_label,
            )
        except Exception as err:
            # Bad input is answered inside decide; this is a bug (of the webhook, or an adapter's
            # EmployerRef it could not use), kept from becoming aiohttp's bare 500 page: the user
            # still reads a cause, and the log has the traceback.
            log.exception("webhook %s: deciding on uid=%s failed", request.path, req.uid)
            outcome = Outcome(
                Verdict.deny(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    f"webhook adapter {adapter.name}: the webhook failed unexpectedly on this request "
                    f"({error_text(err)}); the webhook's log has the details",
                )
            )
        namespace, pod_name = display_name(req)
        decision = AdmissionDecision(
            path=request.path,
            uid=req.uid,
            kind=req.kind.kind,
            operation=req.operation,
            namespace=namespace,
            name=pod_name,
            dry_run=bool(req.dry_run),
            allowed=outcome.verdict.allowed,
            code=outcome.verdict.code,
            message=outcome.verdict.message,
            patch=outcome.verdict.patch,
            employers=outcome.employers,
            seconds=time.monotonic() - started,
        )
        self._record(decision)
        return web.json_response(review_response(req.uid, outcome.verdict), dumps=_compact)

    def _record(self, decision: AdmissionDecision) -> None:
        if decision.allowed:
            log.debug(
                "webhook %s: %s %s %s/%s uid=%s allowed: %s",
                decision.path,
                decision.operation,
                decision.kind,
                decision.namespace,
                decision.name,
                decision.uid,
                decision.message,
            )
        else:
            log.warning(
                "webhook %s: %s %s %s/%s uid=%s denied (%d): %s",
                decision.path,
                decision.operation,
                decision.kind,
                decision.namespace,
                decision.name,
                decision.uid,
                decision.code,
                decision.message,
            )
        if self.observer is not None:
            try:
                self.observer(decision)
            except Exception:
                log.exception("webhook decision observer failed")

    async def _employers(
        self, adapter: WebhookAdapter, pod: KubeObject, limit: float
    ) -> tuple[EmployerRef, ...]:
        """Call the adapter within ``limit`` seconds: coroutines on the loop, plain functions in
        a worker thread (they may block). A thread that overruns is abandoned, not killed."""
        method = adapter.get_employers_by_employee
        # The adapter gets its own copy: whatever it does to it cannot change the patch.
        employee = copy.deepcopy(pod)
        reader = self._reader
        async with asyncio.timeout(limit) as scope:
            try:
                result: Any = await call_adapter(method, employee, reader)
                if not isinstance(result, list | tuple):
                    # A lazy iterable (a generator) may block while it yields: drain it off the loop.
                    result = await call_adapter(list, result)
            except TimeoutError as err:
                if scope.expired():
                    raise
                # The adapter's own TimeoutError is an adapter failure, not our deadline.
                raise AdapterTimeout(str(err)) from err
        employers = tuple(result)
        for item in employers:
            if not isinstance(item, EmployerRef):
                raise TypeError(f"get_employers_by_employee returned {type(item).__name__}, not EmployerRef")
        return employers


def _abort(request: web.Request) -> web.Response:
    """Drop the connection of a request whose body will not arrive; the answer is never sent."""
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=HTTPStatus.REQUEST_TIMEOUT)


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


async def serve(
    adapters: Iterable[WebhookAdapter],
    options: WebhookOptions | None = None,
    *,
    client: KubeClient,
    informers: InformerFactory | None = None,
    observer: Observer | None = None,
    metrics: Metrics | None = None,
) -> WebhookServer:
    """Start the webhook on the running event loop as ``options`` say (default
    ``WebhookOptions()``) and return the started server; ``await server.stop()`` shuts it down.

    With ``options.bootstrap`` (the default) the certificates are ensured first (Secret
    ``resourceconsist-webhook-certs``, caBundles, files in ``cert_dir``) and re-checked
    periodically; without it ``cert_dir`` must already hold ``tls.crt`` and ``tls.key`` (e.g.
    from cert-manager). Either way the files are reloaded when they change. Pass the manager's
    ``informers`` to share its caches; otherwise the server runs its own on ``client``, and its
    ``metrics`` to have the adapters' paths counted there (docs/observability.md).
    """
    server = WebhookServer(
        adapters,
        options,
        informers=informers if informers is not None else InformerFactory(client),
        own_informers=informers is None,
        observer=observer,
        metrics=metrics,
    )
    await server.start()
    return server
