"""The garbage pass: provider items and cluster-scoped sub-resources whose owner employer is gone
(docs/lifecycle-hooks.md, "Orphans" and "Sub-resources").

A Service deleted while the controller was down and stripped of its finalizers by hand leaves
what the provider holds for it behind for ever; the adapter's ``list_owned`` names each item's
owner, and this pass collects the items of owners that no longer exist. It deletes nothing
itself: each gone owner gets one reconcile pass over a deleting stand-in of it, so the
adapter's own ``get_current_*`` and ``delete_*`` do the work and the frame's guard releases
the pods only once the provider confirmed (docs/concepts.md, "The guard").

Against a re-created employer of the same name: the owner key is claimed in the controller's
workqueue first (skipped when a pass is queued or running), then looked up in the cache and
with a live GET; while the claim is held, the employer's own events wait in the queue, so its
next pass runs after the collection and re-creates what it needs.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from resourceconsist import kube
from resourceconsist.adapter import OrphanCollectOptions, OwnedItem, ReconcileContext
from resourceconsist.cancellation import Cancellation, call_adapter, running_pass
from resourceconsist.kube import KubeObject
from resourceconsist.options import GarbageOptions

if TYPE_CHECKING:
    from resourceconsist.controller import Controller

log = logging.getLogger(__name__)

#: The reason of the Event recorded (on the owner's Namespace) per collected owner.
COLLECTED_REASON = "OrphanCollected"
#: Why an owner is skipped while a pass of it is queued or running (tried again soon).
BUSY = "a pass is queued or running"


@dataclass
class GarbageReport:
    """What one garbage pass found and did; owners are employer keys (``namespace/name``)."""

    dry_run: bool = False
    #: Items whose owner is gone, by owner (in dry-run: what would be collected).
    orphans: dict[str, list[str]] = field(default_factory=dict)
    collected: list[str] = field(default_factory=list)
    #: Owners whose collection is under way (the provider still holds something).
    pending: list[str] = field(default_factory=list)
    #: Owners left alone this time, and why (a pass queued or running, found alive by a live GET).
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    #: Cluster-scoped sub-resources (``kind/name``) whose owner is gone.
    strays: list[str] = field(default_factory=list)


def stand_in(resource: kube.Resource, key: str, item: OwnedItem) -> KubeObject:
    """A deleting copy of the gone employer ``key``, carrying what ``item`` says it had."""
    namespace, _, name = key.rpartition("/")
    meta: dict[str, object] = {
        "name": name,
        "labels": dict(item.labels),
        "annotations": dict(item.annotations),
        "deletionTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "finalizers": [],
    }
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": resource.api_version, "kind": resource.kind, "metadata": meta}


class GarbageCollector:
    """One controller's garbage pass, and its loop."""

    def __init__(self, controller: Controller, options: GarbageOptions) -> None:
        self.controller = controller
        self.options = options
        self.last_report: GarbageReport | None = None
        self.passes = 0

    @property
    def wanted(self) -> bool:
        from resourceconsist.subresources import cluster_scoped_kinds

        adapter = self.controller.adapter
        return self.options.enabled and (
            isinstance(adapter, OrphanCollectOptions) or bool(cluster_scoped_kinds(adapter))
        )

    async def run(self) -> None:
        """Run a pass now, then every ``interval`` (sooner while a collection is pending)."""
        while True:
            try:
                report = await self.run_once()
                delay = self.options.interval
                busy = BUSY in report.skipped.values()
                if report.pending or report.failed or busy:
                    delay = min(delay or self.options.retry, self.options.retry)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: garbage pass failed", self.controller.name)
                delay = self.options.retry
            if delay is None:
                return
            await asyncio.sleep(delay)

    async def run_once(self) -> GarbageReport:
        from resourceconsist.subresources import collect_strays

        controller = self.controller
        report = GarbageReport(dry_run=self.options.dry_run)
        if not controller.informers.has_synced:
            # An empty cache would make every owner look gone.
            raise RuntimeError(f"{controller.name}: caches not synced; no garbage pass")
        adapter = controller.adapter
        if isinstance(adapter, OrphanCollectOptions):
            ctx = ReconcileContext(
                reader=controller.reader,
                controller=controller.name,
                employer_key="",
                writer=controller.client,
                recorder=controller.reconciler.recorder,
            )
            owned: list[OwnedItem] = list(await call_adapter(adapter.list_owned, ctx))
            by_owner: dict[str, list[OwnedItem]] = {}
            for item in owned:
                by_owner.setdefault(item.owner, []).append(item)
            for key, items in sorted(by_owner.items()):
                if self.watches(key):
                    await self._one_owner(key, items, report)
        await collect_strays(controller, report, dry_run=self.options.dry_run)
        self.passes += 1
        self.last_report = report
        if report.orphans or report.strays:
            log.info(
                "%s: garbage pass%s: orphans of %s; collected %s; pending %s; skipped %s; strays %s",
                controller.name,
                " (dry run)" if report.dry_run else "",
                ", ".join(sorted(report.orphans)) or "none",
                ", ".join(report.collected) or "none",
                ", ".join(report.pending) or "none",
                ", ".join(f"{k} ({why})" for k, why in sorted(report.skipped.items())) or "none",
                ", ".join(report.strays) or "none",
            )
        return report

    def watches(self, key: str) -> bool:
        """The owner is in what this manager watches (a namespace-bound manager collects in its
        namespace only: elsewhere its cache cannot see the pods to release)."""
        namespace = self.controller.informers.namespace
        return (
            namespace is None
            or not self.controller.spec.employer.namespaced
            or key.rpartition("/")[0] == namespace
        )

    async def owner_exists(self, key: str) -> bool:
        """The employer ``key`` is in the cache or, asked live, in the API server."""
        controller = self.controller
        namespace, _, name = key.rpartition("/")
        resource = controller.spec.employer
        if controller.reader.get(resource, namespace or None, name) is not None:
            return True
        live = await asyncio.to_thread(controller.client.get_or_none, resource, namespace or None, name)
        return live is not None

    async def _one_owner(self, key: str, items: list[OwnedItem], report: GarbageReport) -> None:
        controller = self.controller
        queue = controller.queue
        resource = controller.spec.employer
        namespace, _, name = key.rpartition("/")
        if controller.reader.get(resource, namespace or None, name) is not None:
            return  # alive: not an orphan
        if not queue.claim(key):
            report.skipped[key] = BUSY
            return
        try:
            # Looked up again under the claim: a re-created employer's pass now waits for us.
            if await self.owner_exists(key):
                report.skipped[key] = "the employer exists"
                return
            report.orphans[key] = [item.id for item in items]
            if self.options.dry_run:
                for item in items:
                    log.info("%s: would collect %s of gone %s (dry run)", controller.name, item.id, key)
                return
            merged = OwnedItem(
                owner=key,
                id=items[0].id,
                labels={k: v for item in items for k, v in item.labels.items()},
                annotations={k: v for item in items for k, v in item.annotations.items()},
            )
            cancellation = Cancellation()
            controller._in_flight.add(cancellation)
            try:
                with running_pass(cancellation), controller.metrics.bound(controller.name):
                    result = await controller.reconciler.reconcile(
                        key, stand_in=stand_in(resource, key, merged)
                    )
            except asyncio.CancelledError:
                raise
            except Exception as err:
                report.failed[key] = str(err)
                log.warning("%s: collecting what gone %s left failed: %s", controller.name, key, err)
                return
            finally:
                controller._in_flight.discard(cancellation)
            if not result.collected:
                report.pending.append(key)
                return
            report.collected.append(key)
            for item in items:
                log.info("%s: collected %s of gone %s", controller.name, item.id, key)
                controller.metrics.orphans_collected.labels(controller.name).inc()
            await controller.reconciler.recorder.event(
                _namespace_object(namespace),
                "Normal",
                COLLECTED_REASON,
                f"{controller.name}: deleted {', '.join(i.id for i in items)} left by gone {key}",
            )
        finally:
            queue.done(key)


def _namespace_object(namespace: str) -> KubeObject:
    """The owner is gone: its Event goes on its Namespace (``kubectl describe namespace``)."""
    # Filed in the namespace itself, so ``kubectl get events -n <ns>`` lists it.
    name = namespace or "default"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "namespace": name}}
