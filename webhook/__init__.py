"""The admission webhook: PodOpsLifecycle entries on new pods, before any controller sees them.

A mutating webhook on pod CREATE asks each webhook adapter for the employers of the new pod and
merges their entries into the pod's ``pod.kusionstack.io/available-conditions`` annotation, so a
pod is never service-available before every load balancer that should carry it has it.

- ``adapter``: the WebhookAdapter API, ``EmployerRef``, the ``/mutating-<name>`` path
  convention and the built-in ``ControlledServiceAdapter``;
- ``admission``: AdmissionReview v1 parsing and the pod mutation (through ``lifecycle``);
- ``server``: the HTTPS server (``WebhookServer``), its ``WebhookOptions`` and the ``serve``
  entry point;
- ``bootstrap``: the self-signed CA, serving certificate, Secret and caBundle, and their
  ``BootstrapOptions``;
- ``tls``: the TLS context that follows certificate files on disk;
- ``listener``: accepting connections, TLS on the first byte, deadlines and the connection cap.

Deployment, the path convention and the failure-policy trade-off: ``docs/webhook.md``.
"""

from resourceconsist.webhook.adapter import (
    PATH_PREFIX,
    ControlledServiceAdapter,
    EmployerRef,
    InvalidAdapterName,
    WebhookAdapter,
    WebhookCacheOptions,
    has_label,
    webhook_path,
)
from resourceconsist.webhook.admission import pod_mutation
from resourceconsist.webhook.bootstrap import (
    DEFAULT_SERVICE_NAME,
    BootstrapError,
    BootstrapOptions,
    BootstrapResult,
    WebhookCertificates,
    ensure_webhook_certificates,
    service_hosts,
)
from resourceconsist.webhook.listener import ConnectionLimits, ConnectionStats
from resourceconsist.webhook.server import (
    DEFAULT_ADAPTER_TIMEOUT,
    DEFAULT_CERT_DIR,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_PORT,
    AdmissionDecision,
    WebhookOptions,
    WebhookServer,
    serve,
)
from resourceconsist.webhook.tls import CertificateReloader

__all__ = [
    "DEFAULT_ADAPTER_TIMEOUT",
    "DEFAULT_CERT_DIR",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_PORT",
    "DEFAULT_SERVICE_NAME",
    "PATH_PREFIX",
    "AdmissionDecision",
    "BootstrapError",
    "BootstrapOptions",
    "BootstrapResult",
    "CertificateReloader",
    "ConnectionLimits",
    "ConnectionStats",
    "ControlledServiceAdapter",
    "EmployerRef",
    "InvalidAdapterName",
    "WebhookAdapter",
    "WebhookCacheOptions",
    "WebhookCertificates",
    "WebhookOptions",
    "WebhookServer",
    "ensure_webhook_certificates",
    "has_label",
    "pod_mutation",
    "serve",
    "service_hosts",
    "webhook_path",
]
