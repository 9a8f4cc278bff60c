"""How each pass of one reconciler begins (``PassFactory``), before the orchestrator
(resourceconsist/reconcile/reconciler.py) runs its steps: the adapter's ``ReconcileContext``,
built here only (the controller's handle, the garbage pass and the sub-resources step ask the
reconciler for it); the pass's ``PassState`` with its failure reporting; and what a pass reads of
the cache for the orchestrator: the employees its employer selects, the pods a gone employer's
stand-in must clear, and the budget priority of its provider calls (docs/concepts.md, "The
provider budget").
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping, Sequence

from resourceconsist.adapter import ReconcileContext
from resourceconsist.cluster import kube
from resourceconsist.cluster.interfaces import EventSink, ObjectReader, ObjectWriter
from resourceconsist.cluster.kube import EmployerKey, KubeObject
from resourceconsist.flow import budget
from resourceconsist.flow.budget import Priority
from resourceconsist.flow.cancellation import current_cancellation
from resourceconsist.reconcile import guard
from resourceconsist.reconcile.failures import PassFailures
from resourceconsist.reconcile.memory import Memories
from resourceconsist.reconcile.pods import PodPlaces
from resourceconsist.reconcile.podwriter import PodWriter, RecentWrites
from resourceconsist.reconcile.profile import AdapterProfile
from resourceconsist.reconcile.state import PassState, employer_entry
from resourceconsist.rules import lifecycle


def _current_employer(state: weakref.ref[PassState]) -> Callable[[], KubeObject]:
    """The employer a pass holds now (a step may read it again), for its failure reports. Held
    through a weak reference: the pass owns its failures, and a failure report reaching back to
    the pass by a strong one would make every pass a reference cycle, whose thousands of objects
    only the garbage collector frees (docs/benchmarks.md, "Garbage a pass leaves")."""

    def employer() -> KubeObject:
        alive = state()
        assert alive is not None, "a pass's failures outlived the pass"
        return alive.employer

    return employer


class PassFactory:
    """Begins the passes of one reconciler, from what all of them share: the adapter, the main
    cluster's client, cache and Event sink, the member clusters, and (built here) what is kept
    of each employer between passes, the reconciler's recent pod writes, and where pod employees
    live."""

    def __init__(
        self,
        profile: AdapterProfile,
        client: ObjectWriter,
        reader: ObjectReader,
        recorder: EventSink,
        clusters: Mapping[str, tuple[ObjectWriter, ObjectReader]],
        *,
        api_down: Callable[[], bool],
        report_unguarded: Callable[[int], None],
    ) -> None:
        self.profile = profile
        self.client = client
        self.reader = reader
        self.recorder = recorder
        self.employer_resource = profile.employer
        self.employee_resource = profile.employee
        #: The member clusters by name (the controller adds and removes them while it runs).
        self.clusters = clusters
        self.name = profile.name
        self.api_down = api_down
        #: What is kept of each employer between passes, by employer key.
        self.memory = Memories(report_unguarded)
        #: Pods written by this reconciler that the cache may not show yet (podwriter.RecentWrites).
        self.recent = RecentWrites()
        #: Where the pod employees live, and their freshest copies.
        self.pods = PodPlaces(client, reader, clusters, profile.employees_in_members, self.recent)

    def context(self, key: str) -> ReconcileContext:
        """What the adapter is handed for employer ``key`` ("": no employer)."""
        return ReconcileContext(
            reader=self.reader,
            controller=self.name,
            employer_key=key,
            clusters={name: reader for name, (_, reader) in self.clusters.items()},
            # Set by the controller for the pass it runs (a never-cancelled one outside a pass).
            cancellation=current_cancellation(),
            writer=self.client,
            recorder=self.recorder,
            # No employer (""), as the garbage pass's ``list_owned``: nothing to remember.
            memo=self.memory.of(key).memo if key else {},
        )

    def begin(
        self,
        key: EmployerKey,
        employer: KubeObject,
        *,
        stand_in: bool,
        report_retried: Callable[[str], None],
        warn_after: tuple[int, float],
    ) -> PassState:
        """The state of a new pass over ``employer``; its failures become a Warning once met on
        ``warn_after`` (passes, seconds), and are reported to ``report_retried`` until then
        (docs/concepts.md, "When a failure becomes a Warning")."""
        follows = self.profile.follows_lifecycle
        entry = employer_entry(employer) if follows else None
        namespace = key.namespace
        p = PassState(
            employer=employer,
            ctx=self.context(key),
            writer=PodWriter(namespace, self.pods.locate, entry, self.recent, by=str(key)),
            key=key,
            deleting=lifecycle.is_deleting(employer),
            follows_lifecycle=follows,
            pod_of=functools.partial(self.pods.get, namespace=namespace),
            stand_in=stand_in,
        )
        if entry is not None:
            p.entry = entry
        p.failures = PassFailures(
            controller=self.name,
            key=key,
            employer=_current_employer(weakref.ref(p)),
            recorder=self.recorder,
            streaks=self.memory.of(key).streaks,
            api_down=self.api_down,
            report_retried=report_retried,
            warn_after_passes=warn_after[0],
            warn_after_seconds=warn_after[1],
        )
        return p

    async def selected(self, p: PassState, *, fresh: bool = False) -> list[str]:
        """The employees the employer selects, read once per pass (``fresh``: read again, for
        decisions about pods that may have reached the cache since)."""
        if p.selected is not None and not fresh:
            return p.selected
        selected = await self.profile.selected_names(p.ctx, p.employer, self.reader)
        if p.selected is None:
            p.selected = selected
        return selected

    def unselected(self, p: PassState) -> Sequence[KubeObject]:
        """Pods that may hold the employer's entry though nothing selects them: for a gone
        employer's stand-in, its namespace's pods, whose entries would otherwise stay on them for
        ever (docs/lifecycle-hooks.md, "Orphans"); none otherwise."""
        if p.stand_in and not self.pods.in_members():
            return self.reader.list(kube.POD, p.writer.namespace)
        return ()

    def carriers(self, p: PassState) -> set[str]:
        """The pods whose cached copy carries the employer's guard or lifecycle finalizer."""
        namespace = str(p.employer["metadata"].get("namespace") or "")
        return self.pods.carrying(namespace, (p.entry.guard_finalizer, p.entry.lifecycle_finalizer))

    def priority(self, p: PassState) -> Priority:
        """The budget priority of the pass's provider reads: removal when it takes traffic off
        something, as the cache tells before any call (``guard.removes_traffic``, which walks the
        employer's carriers: not worked out when no budget would read it)."""
        if not budget.in_use():
            return Priority.READ
        if p.deleting or p.stand_in:
            return Priority.REMOVE_TRAFFIC
        if not p.follows_lifecycle:
            return Priority.READ
        removes = guard.removes_traffic(self.carriers(p), set(p.selected or ()), p.pod_of)
        return Priority.REMOVE_TRAFFIC if removes else Priority.READ
