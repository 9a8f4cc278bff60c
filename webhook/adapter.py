"""The webhook side of the adapter API: the path convention and the built-in adapter.

A webhook adapter has a ``name`` and answers ``get_employers_by_employee(pod, reader)`` with the
employers of a pod that is being created, as ``EmployerRef`` (kind, namespace, name). The
webhook turns each into an ``expectedFinalizers`` entry of the pod's
``pod.kusionstack.io/available-conditions`` annotation through ``resourceconsist.rules.lifecycle``,
the same functions the controller uses.

``WebhookAdapter`` and ``EmployerRef`` live in ``resourceconsist.adapter`` (the adapter API the
frame types against, e.g. the registry's webhook factories) and are re-exported here.

Path convention: the adapter named ``<name>`` is served at ``/mutating-<name>``
(``webhook_path``). Names are DNS-1123 labels (lowercase letters, digits, ``-``), so the path
is safe in a URL and in a MutatingWebhookConfiguration, and one server can carry several
adapters side by side.

``ControlledServiceAdapter`` is the built-in adapter for the common case: the employers are the
Services in the pod's namespace whose selector selects the pod and that carry
``kusionstack.io/control: "true"``, optionally narrowed by a predicate.

An ``EmployerRef`` may also ask for changes of the pod's spec (docs/zero-downtime.md): the
employer's readiness gate (``readiness_gate``) and a drain of the employer's drain time
(``drain_seconds``), a ``preStop`` sleep or the drain waiter (``drain_mode``).
``ControlledServiceAdapter`` asks for them when the pod's Namespace carries the label
``resource-consist.kusionstack.io/readiness-gate-inject: enabled`` and the Service the matching
annotations.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Final

from resourceconsist import wire
from resourceconsist.adapter import EmployerRef, EmployersResult, WebhookAdapter, WebhookCacheOptions
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import CacheReader
from resourceconsist.cluster.kube import KubeObject, Resource
from resourceconsist.errors import ResourceConsistError
from resourceconsist.rules import gates, lifecycle

log = logging.getLogger("resourceconsist.webhook")

__all__ = [
    "PATH_PREFIX",
    "ControlledServiceAdapter",
    "EmployerRef",
    "EmployersResult",
    "InvalidAdapterName",
    "ServicePredicate",
    "WebhookAdapter",
    "WebhookCacheOptions",
    "has_label",
    "injection_enabled",
    "spec_drain_mode",
    "spec_options",
    "validate_adapter_name",
    "webhook_path",
]

#: Prefix of every adapter's URL path: ``/mutating-<adapter name>``.
PATH_PREFIX: Final = "/mutating-"

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MAX_NAME = 63


class InvalidAdapterName(ResourceConsistError, ValueError):
    """A webhook adapter name that cannot be a URL path segment by the convention."""


def validate_adapter_name(name: str) -> str:
    """Return ``name`` if it is a DNS-1123 label, else raise ``InvalidAdapterName``."""
    if not isinstance(name, str) or len(name) > _MAX_NAME or not _NAME.match(name):
        raise InvalidAdapterName(
            f"webhook adapter name {name!r} must be a DNS-1123 label "
            "(at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit)"
        )
    return name


def webhook_path(name: str) -> str:
    """The URL path the server registers for the adapter named ``name``."""
    return PATH_PREFIX + validate_adapter_name(name)


ServicePredicate = Callable[[KubeObject], bool]


def has_label(key: str, value: str | None = None) -> ServicePredicate:
    """A predicate: the object carries label ``key`` (with ``value``, when given)."""

    def predicate(obj: KubeObject) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return key in labels and (value is None or labels[key] == value)

    return predicate


def injection_enabled(namespace: KubeObject | None) -> bool:
    """Whether the Namespace lets the webhook change its pods' specs (readiness gates, preStop)."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(wire.READINESS_GATE_INJECT_LABEL) == wire.READINESS_GATE_INJECT_VALUE


def spec_options(service: KubeObject) -> tuple[bool, int | None]:
    """What a Service's annotations ask of the pods it selects: (a readiness gate, drain seconds).

    An unreadable drain time is logged and ignored: a pod is never refused for it."""
    try:
        drain = gates.drain_seconds(service)
    except gates.InvalidAnnotation as err:
        log.warning("Service %s: %s; no preStop hook is injected", kube.object_key(service), err)
        drain = None
    return gates.gates_enabled(service), drain


def spec_drain_mode(service: KubeObject) -> str:
    """How the Service's drain ends (``sleep`` or ``wait``); an unreadable mode is logged and
    read as ``sleep``, the drain every cluster can run: a pod is never refused for it."""
    try:
        return gates.drain_mode(service)
    except gates.InvalidAnnotation as err:
        log.warning("Service %s: %s; the drain sleeps", kube.object_key(service), err)
        return "sleep"


class ControlledServiceAdapter:
    """Employers = the Services that select the pod and carry ``kusionstack.io/control: "true"``.

    ``predicate`` narrows them further (e.g. the SLB adapter keeps Services that name a load
    balancer). Services being deleted are skipped: they will not put their lifecycle finalizer
    on a new pod, so an entry for them would only hold the pod back until the controller
    removed it again. In a Namespace labelled for injection, each Service's annotations say
    whether its readiness gate and a ``preStop`` sleep go into the pod (docs/zero-downtime.md).
    """

    def __init__(self, name: str, *, predicate: ServicePredicate | None = None) -> None:
        self._name = validate_adapter_name(name)
        self._predicate = predicate

    @property
    def name(self) -> str:
        return self._name

    def get_cached_resources(self) -> Sequence[Resource]:
        return (kube.SERVICE, kube.NAMESPACE)

    def get_employers_by_employee(self, employee: KubeObject, reader: CacheReader) -> list[EmployerRef]:
        employers: list[EmployerRef] = []
        namespace = str(employee.get("metadata", {}).get("namespace") or "")
        inject = injection_enabled(reader.get(kube.NAMESPACE, None, namespace)) if namespace else False
        for service in reader.services_selecting(employee):
            labels = service.get("metadata", {}).get("labels") or {}
            if labels.get(wire.CONTROL_LABEL) != wire.CONTROL_LABEL_VALUE:
                continue
            if lifecycle.is_deleting(service):
                continue
            if self._predicate is not None and not self._predicate(service):
                continue
            ref = EmployerRef.of(service, kind=kube.SERVICE.kind)
            if inject:
                gate, drain = spec_options(service)
                mode = spec_drain_mode(service) if drain else "sleep"
                ref = EmployerRef(ref.kind, ref.namespace, ref.name, gate, drain, mode)
            employers.append(ref)
        return sorted(employers)

    def __repr__(self) -> str:
        return f"ControlledServiceAdapter(name={self._name!r})"
