"""The small I/O protocols the reconcile steps depend on: read objects, write objects, record Events.

The frame's real implementations are ``cache.CacheReader`` (informer caches), ``kube.KubeClient``
(the API server) and ``events.EventRecorder``. ``Reconciler`` and ``PodWriter`` take these
protocols, not the classes, so the step logic can be unit-tested against in-memory fakes
(tests/frame/test_reconcile_steps.py) beside the real-control-plane tests that claim the end-to-end
behaviour. Adapters get the same three through ``ReconcileContext`` (``reader``, ``writer``,
``recorder``).

All three are blocking except ``EventSink.event``; async code calls blocking ones through
``cancellation.call_adapter``, which runs them in daemon threads, and the frame's own pod writes
through ``aiokube``, which sends a ``KubeClient``'s from the event loop (docs/concepts.md,
"The runtime").
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from resourceconsist.cluster.kube import KubeObject, PatchType, Resource

EventType = Literal["Normal", "Warning"]


class ObjectReader(Protocol):
    """Cache-backed reads (never a LIST per call)."""

    def get(self, resource: Resource, namespace: str | None, name: str) -> KubeObject | None: ...

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        label_selector: Mapping[str, Any] | None = None,
    ) -> builtins.list[KubeObject]: ...

    def pods_selected_by(self, service: KubeObject) -> builtins.list[KubeObject]: ...

    def pods_with_finalizer(self, namespace: str, finalizer: str) -> builtins.list[KubeObject]: ...

    def pods_with_readiness_gate(self, namespace: str, condition_type: str) -> builtins.list[KubeObject]: ...


class ObjectWriter(Protocol):
    """Writes to the API server; ``patch_optimistic`` carries the resourceVersion precondition."""

    def get_or_none(self, res: Resource, namespace: str | None, name: str) -> KubeObject | None: ...

    def patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
    ) -> KubeObject: ...

    def patch_optimistic(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        change: Callable[[KubeObject], dict[str, Any] | None],
        *,
        current: KubeObject | None = None,
        attempts: int = 8,
    ) -> tuple[KubeObject | None, bool]: ...


class EventSink(Protocol):
    """Records Kubernetes Events (where users look); never raises."""

    async def event(
        self,
        obj: KubeObject,
        type_: EventType,
        reason: str,
        message: str,
        annotations: Mapping[str, str] | None = None,
    ) -> None: ...
