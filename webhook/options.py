"""The settings of the webhook server: ``WebhookOptions``, with ``BootstrapOptions``,
``ConnectionLimits`` and ``DrainWaiterOptions`` inside, and their defaults
(docs/reference/options.md).

They live apart from the server, the certificate bootstrap and the listener they configure and
import only the standard library, the wire contract and the error tree, so the command line takes its flags'
defaults from them without importing aiohttp, cryptography or the Kubernetes client
(``resourceconsist --help`` stays light).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from resourceconsist import wire
from resourceconsist.errors import InvalidOptions, check_count, check_seconds

#: controller-runtime's webhook port, which the Service in config/webhook targets.
DEFAULT_PORT: Final = 9443
#: Bound on one adapter call; below the manifests' ``timeoutSeconds: 10`` with room for the
#: round trip, so the API server gets our answer rather than its own timeout.
DEFAULT_ADAPTER_TIMEOUT: Final = 5.0
#: The API server accepts objects up to 3 MiB; a review carries the object, the old object
#: (on UPDATE) and an envelope, so 7 MiB (controller-runtime's limit too) fits every real review.
DEFAULT_MAX_BODY_BYTES: Final = 7 * 1024 * 1024
#: Where the serving certificate is written or read: controller-runtime's default directory.
DEFAULT_CERT_DIR: Final = Path("/tmp/k8s-webhook-server/serving-certs")
#: The Service in front of the webhook (``config/webhook/service.yaml``).
DEFAULT_SERVICE_NAME: Final = "resourceconsist-manager"
#: Lifetimes of the self-made certificates (docs/webhook.md, "Certificates and their rotation"):
#: the serving certificate a year, like a public CA's; the CA five years, so that its rotation
#: (with an overlap in caBundle) happens every few years, not never.
DEFAULT_SERVING_VALIDITY: Final = datetime.timedelta(days=365)
DEFAULT_CA_VALIDITY: Final = datetime.timedelta(days=5 * 365)
#: A certificate is renewed once this share of its life has passed (cert-manager's default).
RENEW_AT_FRACTION: Final = 2 / 3
#: How long both CAs stay trusted around a CA rotation: after the new CA is in every caBundle,
#: before the serving certificate is reissued by it; and after that, before the old CA is dropped.
#: Longer than the re-check ``interval``, so every replica serves the new certificate by then.
DEFAULT_CA_OVERLAP: Final = datetime.timedelta(hours=1)


def service_hosts(service_name: str, namespace: str) -> tuple[str, str]:
    """The DNS names the API server uses for the webhook Service."""
    return f"{service_name}.{namespace}.svc", f"{service_name}.{namespace}.svc.cluster.local"


@dataclass(frozen=True)
class ConnectionLimits:
    """Deadlines and the connection cap of the webhook listener (seconds, connections)."""

    handshake_timeout: float = 10.0
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    #: Longer than the API server's own idle timeout for webhook connections (90 s), so the
    #: client closes first and never sends a request into a connection we are closing.
    idle_timeout: float = 120.0
    max_connections: int = 4096

    def __post_init__(self) -> None:
        for name in ("handshake_timeout", "header_timeout", "body_timeout", "idle_timeout"):
            check_seconds(name, getattr(self, name))
        check_count("max_connections", self.max_connections)


@dataclass(frozen=True)
class BootstrapOptions:
    """How the webhook makes and keeps its self-signed certificates (the steps: ``resourceconsist.webhook
    .bootstrap``); part of ``WebhookOptions``. Bad values raise ``InvalidOptions`` naming the field."""

    #: The Service in front of the webhook; the serving certificate covers its two DNS names.
    service_name: str = DEFAULT_SERVICE_NAME
    #: Namespace of that Service and of the certificate Secret; None: the pod's own
    #: (``$POD_NAMESPACE``), else ``resourceconsist``.
    namespace: str | None = None
    #: More DNS names or IPs the serving certificate covers (e.g. for a webhook the API server
    #: reaches by URL during development).
    extra_hosts: tuple[str, ...] = ()
    #: Register a URL-based MutatingWebhookConfiguration pointing here (``https://host:port``),
    #: for a server outside the cluster (docs/webhook.md); the certificate covers its host too.
    webhook_url: str | None = None
    #: Seconds between two re-checks by a running server, so a certificate rotated by another
    #: replica reaches this one's files; None: at start only.
    interval: float | None = 600.0
    #: Renew a certificate this long before it expires; None: once two thirds of its life passed.
    renew_before: datetime.timedelta | None = None
    #: Lifetime of the serving certificate and of the CA that signs it.
    serving_validity: datetime.timedelta = DEFAULT_SERVING_VALIDITY
    ca_validity: datetime.timedelta = DEFAULT_CA_VALIDITY
    #: Both CAs trusted this long at each step of a CA rotation (``DEFAULT_CA_OVERLAP``).
    ca_overlap: datetime.timedelta = DEFAULT_CA_OVERLAP
    #: What time it is for the renewal decisions (tests move it); None: the system's UTC clock.
    #: Certificates always carry the system's time, whatever this says.
    clock: Callable[[], datetime.datetime] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # Any iterable of names will do; kept as a tuple so the options stay hashable.
        object.__setattr__(self, "extra_hosts", tuple(self.extra_hosts))
        if not self.service_name:
            raise InvalidOptions("the webhook Service needs a name", "service_name")
        check_seconds("interval", self.interval)
        if self.renew_before is not None and self.renew_before < datetime.timedelta(0):
            raise InvalidOptions(
                f"renew before must not be negative (got {self.renew_before})", "renew_before"
            )
        for name in ("serving_validity", "ca_validity"):
            if getattr(self, name) <= datetime.timedelta(0):
                raise InvalidOptions(f"{name} must be positive (got {getattr(self, name)})", name)
        if self.serving_validity > self.ca_validity:
            raise InvalidOptions(
                f"the serving certificate cannot outlive its CA "
                f"({self.serving_validity} > {self.ca_validity})",
                "serving_validity",
                "ca_validity",
            )
        if self.interval is not None and self.ca_overlap.total_seconds() <= self.interval:
            raise InvalidOptions(
                f"ca_overlap ({self.ca_overlap}) must be longer than the re-check interval "
                f"({self.interval:g}s), so every replica serves the new certificate before the old CA goes",
                "interval",
                "ca_overlap",
            )
        if self.webhook_url is not None:
            parts = urlsplit(self.webhook_url)
            if parts.scheme != "https" or not parts.hostname:
                raise InvalidOptions(
                    f"{self.webhook_url!r} is not an https:// URL with a host; give e.g. https://127.0.0.1:9443",
                    "webhook_url",
                )

    def now(self) -> datetime.datetime:
        """The time renewal decisions are taken at (``clock``, else the system's)."""
        return self.clock() if self.clock is not None else datetime.datetime.now(datetime.UTC)

    def hosts(self, namespace: str) -> tuple[str, ...]:
        """What the serving certificate covers: the Service's DNS names in ``namespace``, the
        extra hosts and the host of ``webhook_url``."""
        url_host = urlsplit(self.webhook_url).hostname if self.webhook_url else None
        return tuple(
            dict.fromkeys(
                (*service_hosts(self.service_name, namespace), *self.extra_hosts, *filter(None, [url_host]))
            )
        )


@dataclass(frozen=True)
class DrainWaiterOptions:
    """What the webhook gives the pods of an employer that asks for the ``wait`` drain
    (docs/zero-downtime.md, "A drain that waits for the provider"): a native sidecar running
    ``resourceconsist drain-waiter`` from ``image``, which asks the managers at ``endpoints``
    whether a provider still routes to the pod. Without these options such pods get the sleep."""

    #: The sidecar's image: the manager's own (it has the ``resourceconsist`` command).
    image: str
    #: The managers' drain endpoints (``resourceconsist run --drain-bind-address``) as pods reach
    #: them, e.g. ``http://resourceconsist-drain.resourceconsist.svc:8082``; the waiter asks each.
    endpoints: tuple[str, ...]
    #: The port the waiter listens on in the pod: the containers' ``preStop`` hook calls it there.
    port: int = wire.DRAIN_WAITER_PORT

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoints", tuple(self.endpoints))
        if not self.image.strip():
            raise InvalidOptions("the drain waiter needs an image (the manager's own)", "image")
        if not self.endpoints:
            raise InvalidOptions(
                "the drain waiter needs the managers' drain endpoints, e.g. "
                "http://resourceconsist-drain.resourceconsist.svc:8082",
                "endpoints",
            )
        for endpoint in self.endpoints:
            parts = urlsplit(endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
                raise InvalidOptions(
                    f"{endpoint!r} is not a manager's drain endpoint; give http://host:port", "endpoints"
                )
        if not 0 < self.port <= 65535:
            raise InvalidOptions(f"port must be 1 to 65535 (got {self.port})", "port")


@dataclass(frozen=True)
class WebhookOptions:
    """Where the webhook server listens, how long it waits, and where its certificate comes
    from (controller-runtime's ``webhook.Options``). Bad values raise ``InvalidOptions`` naming
    the field."""

    #: Address to bind; None: every interface.
    host: str | None = None
    #: HTTPS port; 0: any free port (``WebhookServer.port`` tells which).
    port: int = DEFAULT_PORT
    #: Directory of ``tls.crt`` and ``tls.key``: written by the bootstrap, else put there by
    #: someone else (e.g. cert-manager). The server reloads them when they change.
    cert_dir: Path = DEFAULT_CERT_DIR
    #: Make and keep a self-signed certificate in ``cert_dir``; None: it is already there.
    bootstrap: BootstrapOptions | None = field(default_factory=BootstrapOptions)
    #: Seconds one adapter call may take (shortened to the API server's own ``?timeout=``).
    adapter_timeout: float = DEFAULT_ADAPTER_TIMEOUT
    #: Largest request body accepted, in bytes.
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Seconds between two looks at the certificate files.
    cert_reload_interval: float = 2.0
    #: Seconds ``stop`` lets admissions in flight finish.
    shutdown_timeout: float = 5.0
    #: The listener's deadlines and connection cap (docs/webhook.md, "Connections and memory").
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    #: Connections the kernel queues while the listener does not accept.
    backlog: int = 1024
    #: The drain waiter given to the pods whose employer asks for the ``wait`` drain; None: they
    #: get the ``preStop`` sleep.
    drain_waiter: DrainWaiterOptions | None = None
    #: Stamp sharding's employer label (``wire.EMPLOYER_LABEL``) on each new pod: the name of the
    #: one Service employing it, else ``Shared``, so the shards of ``run --sharding
    #: --pod-employer-label`` watch only their pods (docs/scaling.md, "Pods selected by the API
    #: server"); off: the label is left to those shards.
    pod_employer_label: bool = False

    def __post_init__(self) -> None:
        # A str will do for the directory; kept as a Path.
        object.__setattr__(self, "cert_dir", Path(self.cert_dir))
        if not 0 <= self.port <= 65535:
            raise InvalidOptions(f"port must be 0 to 65535 (got {self.port})", "port")
        check_seconds("adapter_timeout", self.adapter_timeout)
        check_seconds("cert_reload_interval", self.cert_reload_interval)
        check_seconds("shutdown_timeout", self.shutdown_timeout, zero=True)
        check_count("max_body_bytes", self.max_body_bytes)
        check_count("backlog", self.backlog)
