"""The Kubernetes client wrapper: typed, kind-agnostic, dict-based access to the API server.

It reads its configuration with resourceconsist.cluster.kubeconfig (kubeconfig files, in-cluster, exec
plugins) or from an official client's ``ApiClient``, sends requests through its ``ThreadTransport``
(urllib3), and speaks plain JSON so any kind works the same, CRDs included; the official client's
generated models are never loaded on the way (17 MB and a quarter second of start-up). Every call
blocks: async code runs it in the frame's threads (``asyncio.to_thread``; the one rule for sync and
async is resourceconsist.flow.cancellation's), except the hot path's writes, which
resourceconsist.cluster.aiokube sends from the event loop. Both transports stand behind the seam of
resourceconsist.cluster.transport: the client's ``Access``, its ``RequestLedger`` (every request
counted per verb, so tests and metrics can prove steady state makes no writes, and handed with
its answer code and duration to the observers: the manager's ``rest_client_*`` series,
docs/observability.md), ``api_error`` and the one conflict loop (``precondition_steps``).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import msgspec

from resourceconsist import wire
from resourceconsist.cluster import kubeconfig
from resourceconsist.cluster.kubeconfig import Access, find_cluster
from resourceconsist.cluster.transport import (
    BlockingTransport,
    Decode,
    LoopTransportSlot,
    Reachability,
    RequestLedger,
    RequestObserver,
)
from resourceconsist.errors import ResourceConsistError

log = logging.getLogger(__name__)

KubeObject = dict[str, Any]
PatchType = Literal["merge", "json", "strategic"]

#: The content type of each kind of patch, whichever transport sends it.
PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}


@dataclass(frozen=True)
class Resource:
    """One API resource: where a kind lives and how its URLs are built."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


# Kinds the frame itself uses, known without discovery.
POD = Resource("", "v1", "Pod", "pods")
SERVICE = Resource("", "v1", "Service", "services")
EVENT = Resource("", "v1", "Event", "events")
SECRET = Resource("", "v1", "Secret", "secrets")
NAMESPACE = Resource("", "v1", "Namespace", "namespaces", namespaced=False)
LEASE = Resource("coordination.k8s.io", "v1", "Lease", "leases")
MUTATING_WEBHOOK_CONFIGURATION = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "MutatingWebhookConfiguration",
    "mutatingwebhookconfigurations",
    False,
)
VALIDATING_WEBHOOK_CONFIGURATION = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "ValidatingWebhookConfiguration",
    "validatingwebhookconfigurations",
    False,
)
_KNOWN = {
    (r.api_version, r.kind): r
    for r in (
        POD,
        SERVICE,
        EVENT,
        SECRET,
        NAMESPACE,
        LEASE,
        MUTATING_WEBHOOK_CONFIGURATION,
        VALIDATING_WEBHOOK_CONFIGURATION,
    )
}


class ApiError(ResourceConsistError):
    """A non-2xx answer of the API server, with its status and Status reason/message.

    ``ApiError.of(...)`` builds the subclass for the status callers branch on: ``Forbidden``
    (403), ``NotFound`` (404), ``Conflict`` (409: a stale resourceVersion, or AlreadyExists) and
    ``Gone`` (410)."""

    def __init__(self, status: int, reason: str, message: str, method: str = "", path: str = "") -> None:
        super().__init__(f"{method} {path}: {status} {reason}: {message}".strip())
        self.status = status
        self.reason = reason
        self.message = message

    @staticmethod
    def of(status: int, reason: str, message: str, method: str = "", path: str = "") -> ApiError:
        kind = {403: Forbidden, 404: NotFound, 409: Conflict, 410: Gone}.get(status, ApiError)
        return kind(status, reason, message, method, path)


class Forbidden(ApiError):
    """403: the caller may not make this request (RBAC, or an admission policy). Says nothing
    about whether the object exists: a lookup refused is "unknown", never "gone"."""


class NotFound(ApiError):
    """404: the object (or its namespace) does not exist."""


class Conflict(ApiError):
    """409: the resourceVersion precondition failed, or the object already exists."""


class Gone(ApiError):
    """410: the watch's resourceVersion is too old; list again."""


def is_unreachable(err: BaseException) -> bool:
    """Whether ``err`` means the API server could not be reached (no HTTP answer at all), from
    either transport: urllib3's (threads) or the event loop's (resourceconsist.cluster.aiokube, whose
    pool raises ``ConnectionError`` and ``TimeoutError``: resourceconsist.cluster.http1)."""
    import urllib3.exceptions

    return isinstance(err, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError))


class _QuietRetries(logging.Filter):
    """urllib3 logs each of its own connection retries at WARNING ("Retrying (Retry(total=2...");
    the request's final failure is what matters, and ``Reachability`` reports it once."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and str(record.msg).startswith("Retrying ("):
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


_QUIET_RETRIES = _QuietRetries()


#: What the optimistic-concurrency loop asks its driver for: the object read afresh (this
#: marker), or a merge patch sent (the body, a dict).
READ_AGAIN = object()
PreconditionSteps = Generator[object, Any, tuple["KubeObject | None", bool]]


def precondition_steps(
    res: Resource,
    namespace: str | None,
    name: str,
    change: Callable[[KubeObject], dict[str, Any] | None],
    current: KubeObject | None = None,
    attempts: int = 8,
    on_conflict: Callable[[], None] = lambda: None,
) -> PreconditionSteps:
    """The optimistic-concurrency loop of ``KubeClient.patch_optimistic``, free of I/O: it yields
    ``READ_AGAIN`` for a fresh copy (None: gone) or a patch body, and is sent the answer (or thrown
    its error). A blocking driver (``patch_with_precondition``) and the event loop's
    (resourceconsist.cluster.aiokube) run the same loop, so conflict handling lives here only."""
    obj = current if current is not None else (yield READ_AGAIN)
    for _ in range(attempts):
        if obj is None:
            return None, False
        body = change(obj)
        if body is None:
            return obj, False
        body.setdefault("metadata", {})["resourceVersion"] = obj["metadata"]["resourceVersion"]
        try:
            return (yield body), True
        except NotFound:
            return None, False
        except Conflict:
            on_conflict()
            obj = yield READ_AGAIN
    raise Conflict(
        409, "Conflict", f"still conflicting after {attempts} attempts", "PATCH", res.path(namespace, name)
    )


def patch_with_precondition(
    get_or_none: Callable[[Resource, str | None, str], KubeObject | None],
    patch: Callable[[Resource, str | None, str, Any], KubeObject],
    res: Resource,
    namespace: str | None,
    name: str,
    change: Callable[[KubeObject], dict[str, Any] | None],
    current: KubeObject | None = None,
    attempts: int = 8,
    on_conflict: Callable[[], None] = lambda: None,
) -> tuple[KubeObject | None, bool]:
    """``precondition_steps`` driven by a blocking get/patch pair (an in-memory fake of the API
    server in unit tests uses the same loop)."""
    steps = precondition_steps(res, namespace, name, change, current, attempts, on_conflict)
    try:
        step = next(steps)
        while True:
            try:
                answer = (
                    get_or_none(res, namespace, name)
                    if step is READ_AGAIN
                    else patch(res, namespace, name, step)
                )
            except Exception as err:
                step = steps.throw(err)
            else:
                step = steps.send(answer)
    except StopIteration as done:
        return cast(tuple[KubeObject | None, bool], done.value)


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` (or ``name`` for cluster-scoped objects), client-go's cache key."""
    meta = obj.get("metadata", {})
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


class EmployerKey(str):
    """The key of one employer, parsed once: ``namespace/name``, or ``name`` for a cluster-scoped
    kind (client-go's cache key; controller-runtime's ``client.ObjectKey``). It is a ``str``, so
    the workqueue, the metrics and the adapter API (``ReconcileContext.employer_key``, the keys
    event handlers return) take it as one; the frame reads ``namespace`` and ``name`` from it
    instead of splitting the string at each use. ``EmployerKey(key)`` of one is that one."""

    #: "" for a cluster-scoped employer.
    namespace: str
    name: str

    def __new__(cls, key: str) -> EmployerKey:
        if type(key) is cls:
            return key
        made = super().__new__(cls, key)
        made.namespace, _, made.name = key.rpartition("/")
        return made

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> EmployerKey:
        """The key of the employer object ``obj``."""
        return cls(object_key(obj))

    @classmethod
    def named(cls, namespace: str | None, name: str) -> EmployerKey:
        """The key of the employer ``name`` in ``namespace`` (None or "": cluster-scoped)."""
        return cls(f"{namespace}/{name}" if namespace else name)

    @property
    def namespace_or_none(self) -> str | None:
        """The namespace as the client's calls take it: None for a cluster-scoped employer."""
        return self.namespace or None


def pod_namespace(namespace: str | None = None) -> str:
    """``namespace`` if given, else the pod's own (``$POD_NAMESPACE``), else ``resourceconsist``:
    where the webhook's certificate Secret and the leader-election Lease live by default."""
    return namespace or os.environ.get(wire.POD_NAMESPACE_ENV) or wire.DEFAULT_NAMESPACE


#: Sent with every request, as client-go names its binary: the API server's audit log and its
#: ``apiserver_request_total`` by client tell this controller's requests from others'.
USER_AGENT = f"resourceconsist (python {sys.version_info.major}.{sys.version_info.minor})"


def request_headers(content_type: str, token: str | None) -> dict[str, str]:
    """The headers of every request, whichever transport sends it (this module's threads, or
    resourceconsist.cluster.aiokube's event loop)."""
    headers = {
        "User-Agent": USER_AGENT,
        "Accept": "application/json",
        "Content-Type": content_type,
        # Answers uncompressed (the API server compresses only large lists). http.client sends
        # this by itself; the event loop's pool sends what it is given.
        "Accept-Encoding": "identity",
    }
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def request_url(host: str, path: str, query: Mapping[str, Any] | None = None) -> str:
    """The URL of a request, whichever transport sends it: ``query``'s None values left out."""
    params = [(k, str(v)) for k, v in (query or {}).items() if v is not None]
    return f"{host}{path}?{urllib.parse.urlencode(params)}" if params else host + path


class _OfficialToken:
    """The bearer token of the official client's ``Configuration``, through its own refresh
    hook when it has one (its exec plugin, its in-cluster token file)."""

    def __init__(self, configuration: Any) -> None:
        self._configuration = configuration

    @property
    def dynamic(self) -> bool:
        # Read each time: a hook may be set on the configuration after the client is made.
        return self._configuration.refresh_api_key_hook is not None

    def __call__(self, *, refresh: bool = False) -> str | None:
        bearer = self._configuration.auth_settings().get("BearerToken") or {}
        value = str(bearer.get("value") or "")
        return value.removeprefix("Bearer ").strip() or None


def _access_of_official(configuration: Any) -> tuple[Access, dict[str, Any], str]:
    """The official client's ``Configuration`` as an ``Access``; the urllib3 options only it
    sets (a proxy, ``assert_hostname``); why the event loop's pool cannot honour them."""
    extras: dict[str, Any] = {}
    refusals: list[str] = []
    host = str(configuration.host or "").rstrip("/")
    if not host.startswith(("https://", "http://")):
        refusals.append(f"host {host!r} is not an http(s) URL")
    if getattr(configuration, "proxy", None):
        extras["proxy_url"] = configuration.proxy
        if getattr(configuration, "proxy_headers", None):
            extras["proxy_headers"] = configuration.proxy_headers
        refusals.append("an HTTP proxy is configured")
    if getattr(configuration, "assert_hostname", None) is not None:
        extras["assert_hostname"] = configuration.assert_hostname
        refusals.append("assert_hostname is configured")
    access = Access(
        host=host,
        verify=bool(configuration.verify_ssl),
        ca_file=configuration.ssl_ca_cert or None,
        cert_file=configuration.cert_file or None,
        key_file=configuration.key_file or None,
        tls_server_name=getattr(configuration, "tls_server_name", None) or None,
        token=_OfficialToken(configuration),
    )
    return access, extras, "; ".join(refusals)


class ThreadTransport:
    """``KubeClient``'s own transport: its requests through one urllib3 pool, in the caller's
    thread (up to 64 connections, as the frame's threads, informers, adapters' blocking calls
    and the webhook, may all be in a request). It stands behind ``transport.BlockingTransport``
    and reports to the client's ``RequestLedger`` (resourceconsist.cluster.transport); the
    ledger's send checks run once the pool holds a connected socket, in the thread that then
    writes the request to it."""

    def __init__(
        self, access: Access, ledger: RequestLedger, extras: Mapping[str, Any] | None = None
    ) -> None:
        self.access = access
        self.ledger = ledger
        #: What only an official client's configuration sets (a proxy, ``assert_hostname``).
        self._extras = dict(extras or {})
        self._pool: Any = None  # urllib3's PoolManager, made on the first request
        self._pool_lock = threading.Lock()
        #: The request this thread is sending, for the send check in the pool's send step.
        self._sending = threading.local()

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
        import urllib3

        access = self.access
        ledger = self.ledger
        ledger.sent("watch" if stream else method.lower(), path)
        url = request_url(access.host, path, query)
        headers = request_headers(content_type, access.bearer())
        if isinstance(timeout, tuple):
            limit = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        else:
            limit = urllib3.Timeout(total=timeout)
        data = None if body is None else msgspec.json.encode(body)
        started = time.monotonic()
        self._sending.request = (method, path)
        try:
            response = self._pool_manager().request(
                method, url, body=data, headers=headers, timeout=limit, preload_content=not stream
            )
        except Exception as err:
            ledger.unanswered(method, err, started)
            raise
        finally:
            self._sending.request = None
        ledger.answered(method, path, response.status, started)
        if response.status >= 400:
            payload = response.data  # read whole, a stream's too
            if stream:
                response.release_conn()
            raise api_error(response.status, response.reason or "", payload, method, path)
        if stream:
            return response
        data = response.data
        return (decode or decode_json)(data) if data else {}

    def _before_send(self) -> None:
        """The pool holds a connected socket for this thread's request: the send hook."""
        sending = getattr(self._sending, "request", None)
        if sending is not None:
            self.ledger.before_send(*sending)

    def _pool_manager(self) -> Any:
        """urllib3's pool to the API server, made once."""
        pool = self._pool
        if pool is not None:
            return pool
        with self._pool_lock:
            if self._pool is None:
                access = self.access
                options: dict[str, Any] = {"num_pools": 4, "maxsize": 64, "block": False}
                context = access.ssl_context()
                if context is not None:
                    options["ssl_context"] = context
                    if not access.verify:
                        options["cert_reqs"] = "CERT_NONE"
                    if access.tls_server_name:
                        options["server_hostname"] = access.tls_server_name
                extras = dict(self._extras)
                proxy = extras.pop("proxy_url", None)
                options.update(extras)
                self._pool = _checked_pool_manager(self._before_send, proxy, options)
            return self._pool

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.clear()


def _checked_pool_manager(before_send: Callable[[], None], proxy: str | None, options: dict[str, Any]) -> Any:
    """A urllib3 ``PoolManager`` (a ``ProxyManager`` with ``proxy``) whose pools call
    ``before_send`` in their send step: once a request's connection is connected, right before
    the request is written to it (``HTTPConnectionPool._validate_conn``, urllib3's hook "called
    right before a request is made, after the socket is created")."""
    import urllib3
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    class CheckedHTTPPool(HTTPConnectionPool):
        def _validate_conn(self, conn: Any) -> None:
            super()._validate_conn(conn)
            if conn.is_closed:
                conn.connect()  # as the HTTPS pool does: the check comes after the connect
            before_send()

    class CheckedHTTPSPool(HTTPSConnectionPool):
        def _validate_conn(self, conn: Any) -> None:
            super()._validate_conn(conn)  # connects
            before_send()

    manager = urllib3.ProxyManager(proxy, **options) if proxy else urllib3.PoolManager(**options)
    manager.pool_classes_by_scheme = {"http": CheckedHTTPPool, "https": CheckedHTTPSPool}
    return manager


class KubeClient:
    """Kind-agnostic JSON access to one API server.

    Made from an ``Access`` (resourceconsist.cluster.kubeconfig: what ``from_kubeconfig``, ``in_cluster``
    and ``auto`` load without the official client), or from the official client's ``ApiClient``
    (``KubeClient(api_client)``, which tests and embedding programs already hold): its
    configuration is read into the same ``Access``. Either way requests go through its
    ``transport`` (threads) or, from async code, the event loop's (``loop_transport``;
    resourceconsist.cluster.aiokube), both reporting to its ``ledger``
    (resourceconsist.cluster.transport)."""

    def __init__(self, api_client: Any = None, *, name: str = "", access: Access | None = None) -> None:
        #: The official client's ``ApiClient`` this client was made from, if any (closed with it).
        self.api_client = api_client
        official = getattr(api_client, "configuration", None)
        #: What only the official configuration sets (a proxy, ``assert_hostname``): urllib3
        #: honours it, the event loop's pool does not (``loop_refusal``).
        self._pool_extras: dict[str, Any] = {}
        #: Why the event loop's pool cannot speak for this client (empty: it can).
        self.loop_refusal = ""
        if access is None and official is not None:
            access, self._pool_extras, self.loop_refusal = _access_of_official(official)
        elif access is None:
            self.loop_refusal = "the client has no API server configuration"
        self.name = name
        #: Where every request of this client is counted and observed, whichever transport
        #: sends it, and the send checks it passes (resourceconsist.cluster.transport).
        self.ledger = RequestLedger(name, is_unreachable)
        #: The blocking transport (None: a client without an API server configuration).
        self.transport: BlockingTransport | None = None
        self._access: Access | None = None
        self.access = access
        #: The event loop's transport to this API server, once ``aiokube.for_client`` made it.
        self.loop_transport = LoopTransportSlot()
        self._resources: dict[tuple[str, str], Resource] = dict(_KNOWN)
        logging.getLogger("urllib3.connectionpool").addFilter(_QUIET_RETRIES)  # once: filters are a set

    @property
    def access(self) -> Access | None:
        """Where the API server is and how to authenticate; None: a client that never sends.
        Setting it sends the next requests with the new one."""
        return self._access

    @access.setter
    def access(self, access: Access | None) -> None:
        if self.transport is not None:
            self.transport.close()
        self._access = access
        self.transport = (
            ThreadTransport(access, self.ledger, self._pool_extras) if access is not None else None
        )

    @property
    def requests(self) -> Counter[str]:
        """Requests so far by verb (``get``, ``patch``, ``watch``, ...), both transports'."""
        return self.ledger.requests

    @property
    def requests_by_resource(self) -> Counter[str]:
        """Requests so far by ``"<verb> <resource>"`` (e.g. ``"patch pods"``)."""
        return self.ledger.requests_by_resource

    @property
    def conflicts(self) -> Counter[str]:
        """409 Conflicts met by ``patch_optimistic``, by resource (exported as a metric)."""
        return self.ledger.conflicts

    @property
    def reachability(self) -> Reachability:
        """Whether the API server answers (logged once per outage)."""
        return self.ledger.reachability

    # -- construction ------------------------------------------------------------------

    @classmethod
    def from_kubeconfig(
        cls, path: str | None = None, context: str | None = None, name: str = ""
    ) -> KubeClient:
        """From a kubeconfig file (``$KUBECONFIG`` or ``~/.kube/config`` when ``path`` is None).

        Read by resourceconsist.cluster.kubeconfig; a file that uses what only the official client's
        loader knows (an auth provider, a proxy, basic auth) is read by that loader instead, at
        the cost of loading it (docs/index.md, "Which cluster")."""
        try:
            return cls(access=kubeconfig.load_kubeconfig(path, context), name=name)
        except kubeconfig.Unsupported as unsupported:
            log.info("kubeconfig: %s; read by the official client's loader", unsupported.reason)
            reason = unsupported.reason
        try:  # an extra: a production install does without it (docs/install.md)
            from kubernetes import client, config
            from kubernetes.config.config_exception import ConfigException
        except ModuleNotFoundError as missing:
            raise kubeconfig.KubeConfigError(
                f"{reason}, which only the official client's loader reads, and it is not installed: "
                "pip install 'resourceconsist[kubernetes]'"
            ) from missing

        configuration = client.Configuration()
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=configuration
            )
        except ConfigException as err:
            raise kubeconfig.KubeConfigError(f"kubeconfig: {err}") from err
        return cls(client.ApiClient(configuration), name=name)

    @classmethod
    def in_cluster(cls, name: str = "") -> KubeClient:
        """From the pod's ServiceAccount: its token (re-read as it rotates) and the cluster's CA."""
        return cls(access=kubeconfig.load_incluster(), name=name)

    @classmethod
    def auto(cls, kubeconfig: str | None = None, context: str | None = None, name: str = "") -> KubeClient:
        """The cluster the command line would use (``kubeconfig.find_cluster``, controller-runtime's
        order): the ``kubeconfig`` given, else ``$KUBECONFIG``, else the in-cluster config in a
        pod, else ``~/.kube/config``; ``context`` picks one of the kubeconfig's contexts (given
        where the in-cluster config is chosen, it is an error: there is no context to pick)."""
        source = find_cluster(kubeconfig, context)
        if source.kubeconfig is None:
            return cls.in_cluster(name)
        return cls.from_kubeconfig(source.kubeconfig, context, name)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.api_client is not None:
            self.api_client.close()

    @property
    def url(self) -> str:
        """The API server's URL (``https://host:port``); empty for a client that never sends."""
        return self.access.host if self.access is not None else ""

    @property
    def host(self) -> str:
        """``host:port`` of the API server (client-go's ``host`` label of its request metrics)."""
        return urllib.parse.urlsplit(self.access.host).netloc if self.access is not None else ""

    def observe_requests(self, observer: RequestObserver) -> Callable[[], None]:
        """Tell ``observer`` of every request from now on (watches when their answer starts);
        returns what stops it (``RequestLedger.observe``)."""
        return self.ledger.observe(observer)

    def _send(self, method: str, path: str, **how: Any) -> Any:
        transport = self.transport
        if transport is None:
            raise RuntimeError(self.loop_refusal)
        return transport.request(method, path, **how)

    # -- blocking API ------------------------------------------------------------------------

    def resource(self, api_version: str, kind: str) -> Resource:
        """The Resource for a kind, found by discovery once and cached."""
        found = self._resources.get((api_version, kind))
        if found is not None:
            return found
        group, _, version = api_version.rpartition("/")
        path = f"/apis/{api_version}" if group else f"/api/{api_version}"
        listing = self._send("GET", path)
        for entry in listing.get("resources", []):
            if entry.get("kind") == kind and "/" not in entry.get("name", ""):
                res = Resource(group, version, kind, entry["name"], bool(entry.get("namespaced")))
                self._resources[(api_version, kind)] = res
                return res
        raise LookupError(f"the API server serves no kind {kind} in {api_version}")

    def get(self, res: Resource, namespace: str | None, name: str) -> KubeObject:
        return cast(KubeObject, self._send("GET", res.path(namespace, name)))

    def get_or_none(self, res: Resource, namespace: str | None, name: str) -> KubeObject | None:
        try:
            return self.get(res, namespace, name)
        except NotFound:
            return None

    def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        decode: Decode | None = None,
    ) -> KubeObject:
        """One LIST page: the raw list object (``items``, ``metadata.resourceVersion``);
        ``decode`` turns its bytes into it (a cache's lean decoder, resourceconsist.cluster.transform)."""
        query = {
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "resourceVersion": resource_version,
            "limit": limit,
            "continue": continue_token,
        }
        return cast(KubeObject, self._send("GET", res.path(namespace), query=query, decode=decode))

    def create(
        self, res: Resource, namespace: str | None, body: Mapping[str, Any], *, dry_run: bool = False
    ) -> KubeObject:
        """POST a new object; ``dry_run`` has the API server validate and admit it without storing."""
        query = {"dryRun": "All"} if dry_run else None
        return cast(KubeObject, self._send("POST", res.path(namespace), query=query, body=dict(body)))

    def replace(self, res: Resource, namespace: str | None, name: str, body: Mapping[str, Any]) -> KubeObject:
        return cast(KubeObject, self._send("PUT", res.path(namespace, name), body=dict(body)))

    def patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
    ) -> KubeObject:
        return cast(
            KubeObject,
            self._send(
                "PATCH",
                res.path(namespace, name, subresource),
                body=body,
                content_type=PATCH_CONTENT_TYPES[patch_type],
            ),
        )

    def delete(self, res: Resource, namespace: str | None, name: str) -> None:
        self._send("DELETE", res.path(namespace, name))

    def watch(
        self,
        res: Resource,
        namespace: str | None,
        resource_version: str,
        *,
        timeout_seconds: int = 300,
        label_selector: str | None = None,
        decode: Decode | None = None,
    ) -> WatchStream:
        """Open a watch from ``resource_version`` with bookmarks; iterate it for
        ``{"type", "object"}`` events (each line turned into one by ``decode``), ``close()`` it
        from any thread to stop."""
        response = self._send(
            "GET",
            res.path(namespace),
            query=watch_query(resource_version, timeout_seconds, label_selector),
            timeout=(10.0, timeout_seconds + 30.0),
            stream=True,
        )
        return WatchStream(response, decode or decode_json)

    def patch_optimistic(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        change: Callable[[KubeObject], dict[str, Any] | None],
        *,
        current: KubeObject | None = None,
        attempts: int = 8,
    ) -> tuple[KubeObject | None, bool]:
        """Merge-patch ``change(obj)`` under optimistic concurrency.

        The patch carries the object's resourceVersion as a precondition; on 409 Conflict the
        object is read again and ``change`` recomputed on the fresh copy, so a concurrent
        writer's edit to the same list or map is never overwritten. ``change`` returns None
        when nothing needs writing. Starts from ``current`` (e.g. a cached copy) when given.
        Returns (the object as it now is, or None when it is gone; whether a write happened).
        """

        return patch_with_precondition(
            self.get_or_none,
            self.patch,
            res,
            namespace,
            name,
            change,
            current,
            attempts,
            functools.partial(self.ledger.conflicted, res.plural),
        )


class WatchStream:
    """An open watch: iterate for events; ``close()`` from another thread ends the iteration."""

    def __init__(self, response: Any, decode: Decode) -> None:
        self._response = response
        self._decode = decode
        self._closed = False

    def __iter__(self) -> Iterator[KubeObject]:
        lines = Lines()
        try:
            for chunk in self._response.stream(amt=None, decode_content=False):
                for line in lines.feed(chunk):
                    if self._closed:
                        return
                    yield self._decode(line)
        except Exception:
            if self._closed:
                return
            raise
        finally:
            self._response.release_conn()

    def close(self) -> None:
        self._closed = True
        shutdown = getattr(self._response, "shutdown", None)  # urllib3 >= 2.3 unblocks a reader
        try:
            if shutdown is not None:
                shutdown()
            else:
                self._response.close()
        except Exception:
            log.debug("closing a watch failed", exc_info=True)


#: The JSON decoder of every answer: msgspec's, about twice the standard library's speed (a
#: watched pod is decoded on every change of it; docs/benchmarks.md).
decode_json: Decode = msgspec.json.Decoder().decode


class Lines:
    """A watch's newline-delimited JSON, split as its chunks arrive (a line may span chunks);
    both transports feed it."""

    def __init__(self) -> None:
        # A bytearray grows in place: a large object arriving in many chunks is not copied
        # again with each one.
        self._rest = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` completes, without their newline; empty lines left out."""
        self._rest += chunk
        if b"\n" not in chunk:
            return []
        lines = bytes(self._rest).split(b"\n")
        self._rest = bytearray(lines.pop())
        return [line for line in lines if line]


def watch_query(
    resource_version: str, timeout_seconds: int, label_selector: str | None = None
) -> dict[str, str]:
    """The query of a watch from ``resource_version``, with bookmarks, that the API server ends
    after ``timeout_seconds``."""
    query = {
        "watch": "true",
        "resourceVersion": resource_version,
        "allowWatchBookmarks": "true",
        "timeoutSeconds": str(timeout_seconds),
    }
    if label_selector is not None:
        query["labelSelector"] = label_selector
    return query


def api_error(status: int, reason: str, body: Any, method: str, path: str) -> ApiError:
    """The error of a non-2xx answer, whichever transport got it: its status's ``ApiError``
    subclass, with the reason and message of the Status object in ``body`` (bytes or text)."""
    message = ""
    if isinstance(body, bytes | bytearray):
        body = body.decode(errors="replace")
    if isinstance(body, str) and body:
        try:
            parsed = json.loads(body)
            message = parsed.get("message", "") if isinstance(parsed, dict) else body
            reason = (parsed.get("reason") if isinstance(parsed, dict) else None) or reason
        except json.JSONDecodeError:
            message = body[:500]
    return ApiError.of(status, reason, message, method, path)
