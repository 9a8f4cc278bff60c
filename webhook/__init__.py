"""The admission webhook: PodOpsLifecycle entries on new pods, before any controller sees them.

A mutating webhook on pod CREATE asks each webhook adapter for the employers of the new pod and
merges their entries into the pod's ``pod.kusionstack.io/available-conditions`` annotation, so a
pod is never service-available before every load balancer that should carry it has it.

- ``adapter``: the WebhookAdapter API, ``EmployerRef``, the ``/mutating-<name>`` path
  convention and the built-in ``ControlledServiceAdapter``;
- ``admission``: AdmissionReview v1 parsing, the decision on each review and the pod mutation
  (through ``lifecycle``);
- ``server``: the HTTPS server (``WebhookServer``) and the ``serve`` entry point;
- ``options``: its settings, ``WebhookOptions`` with ``BootstrapOptions`` and ``ConnectionLimits``;
- ``bootstrap``: the self-signed CA, serving certificate, Secret and caBundle;
- ``tls``: the TLS context that follows certificate files on disk;
- ``listener``: accepting connections, TLS on the first byte, deadlines and the connection cap.

Deployment, the path convention and the failure-policy trade-off: ``docs/webhook.md``.

Names are loaded on first use (PEP 562), as at the package root: ``resourceconsist.webhook
.options`` alone loads neither aiohttp nor cryptography.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resourceconsist.lazy import lazy_exports

if TYPE_CHECKING:
    from resourceconsist.cluster.certwatcher import CertificateReloader
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
        BootstrapError,
        BootstrapResult,
        WebhookCertificates,
        ensure_webhook_certificates,
    )
    from resourceconsist.webhook.listener import ConnectionStats
    from resourceconsist.webhook.options import (
        DEFAULT_ADAPTER_TIMEOUT,
        DEFAULT_CERT_DIR,
        DEFAULT_MAX_BODY_BYTES,
        DEFAULT_PORT,
        DEFAULT_SERVICE_NAME,
        BootstrapOptions,
        ConnectionLimits,
        WebhookOptions,
        service_hosts,
    )
    from resourceconsist.webhook.server import AdmissionDecision, WebhookServer, serve

#: The public names, as the block above imports them (the one table of their homes,
#: resourceconsist.lazy); written out as a literal for linters, checked by tests/api/test_public_api.py.
__all__ = (
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
)

__getattr__, __dir__ = lazy_exports(__name__)
