"""The finalizers and records that keep the promise (docs/concepts.md, "The finalizers and what
they protect"; "One reconcile", steps 2, 3 and 6): the employer's clean finalizer
(``ensure_clean_finalizer``, ``release_clean_finalizer``), its entry in each selected pod's
``available-conditions`` (``plan_expected_entries``, and the record of who got it), what a pod
carries after the pass's writes (``finalizers_after``), the pass's pod writes and the employer's
record annotations (``write_planned``: ``records_after_writes``, ``patch_record_annotations``) and
the pod writes' failures (``raise_write_failures``).

What to plan is decided here from what the pass read; the employer's own writes
(``EmployerWrites``; ``patch_employer_annotations`` for a writer outside a reconciler) go out on
the frame's transport, never in the adapters' threads (resourceconsist.flow.cancellation).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from resourceconsist import wire
from resourceconsist.cluster import aiokube, kube
from resourceconsist.cluster.interfaces import EventSink, ObjectReader, ObjectWriter
from resourceconsist.cluster.kube import ApiError, KubeObject, Resource
from resourceconsist.reconcile.failures import PassFailures
from resourceconsist.reconcile.podwriter import EmployerEntry, PodWriter, PodWriteResult, RecentWrites
from resourceconsist.rules import lifecycle
from resourceconsist.wire import EventReason

log = logging.getLogger(__package__)

#: A pod employee's freshest copy (the pass's cache, with its own recent writes), or None.
PodOf = Callable[[str], KubeObject | None]


def old_clean_finalizer(employer: KubeObject) -> str:
    """The per-name clean finalizer older versions of the Go frame put on the employer."""
    return wire.OLD_CLEAN_FINALIZER_PREFIX + str(employer["metadata"]["name"])


def holds_entry(pod: KubeObject, key: str) -> bool:
    """The pod's ``available-conditions`` hold the entry ``key`` (a malformed one counts as not)."""
    try:
        return lifecycle.has_expected_finalizer(pod, key)
    except lifecycle.MalformedAvailableConditions:
        return False


def guarded(finalizers: Sequence[str], entry: EmployerEntry) -> bool:
    """The finalizers hold this employer's guard or lifecycle finalizer."""
    return entry.guard_finalizer in finalizers or entry.lifecycle_finalizer in finalizers


def record_list(obj: KubeObject, annotation: str) -> list[str]:
    """The names a record annotation (comma-separated) holds."""
    value = (obj.get("metadata", {}).get("annotations") or {}).get(annotation, "")
    return [name for name in value.split(",") if name]


def plan_entries(
    selected: Collection[str],
    *,
    deleting: bool,
    recorded: Sequence[str] | None,
    has_entry: Callable[[str], bool],
) -> tuple[set[str], set[str]]:
    """The pods that get the employer's entry, and those that lose it: every selected pod (none
    when deleting), and with a record (``recorded``), the recorded pods no longer selected."""
    if recorded is not None:
        known = set(recorded)
        if deleting:
            return set(), known | set(selected)
        # The record names pods, not pod instances: a pod re-created under a recorded name
        # lacks the entry, and the record alone would never give it back.
        return {n for n in selected if n not in known or not has_entry(n)}, known - set(selected)
    if deleting:
        return set(), set(selected)
    return set(selected), set()


def record_annotations(
    employer: KubeObject,
    written: PodWriteResult,
    *,
    expected_record: Sequence[str] | None,
    adds: Collection[str],
    removes: Collection[str],
    lifecycle_record: bool,
    carriers: Collection[str],
    carries_lifecycle: Callable[[str], bool],
) -> dict[str, str]:
    """The employer's record annotations that this pass's pod writes changed."""
    annotations: dict[str, str] = {}
    if expected_record is not None:
        removed = {n for n in removes if n in written.done and n not in written.deferred}
        kept = [n for n in expected_record if n not in removed]
        added = sorted(set(kept) | {n for n in adds if n in written.done})
        # Compared as a set: the Go original writes the record unsorted, and a takeover
        # rewrites nothing only to re-sort it (docs/concepts.md, "The finalizers and what
        # they protect").
        if set(added) != set(expected_record):
            annotations[wire.EXPECTED_FINALIZER_ADDED_ANNOTATION] = ",".join(added)
    if lifecycle_record:
        recorded = record_list(employer, wire.LIFECYCLE_FINALIZER_RECORDED_ANNOTATION)
        having = sorted(n for n in {*recorded, *carriers, *written.finalizers} if carries_lifecycle(n))
        if set(having) != set(recorded):  # a set, as above
            annotations[wire.LIFECYCLE_FINALIZER_RECORDED_ANNOTATION] = ",".join(having)
    return annotations


def _finalizers_change(
    add: Sequence[str], remove: Sequence[str]
) -> Callable[[KubeObject], dict[str, Any] | None]:
    """The employer finalizers' change: nothing when a fresh copy already has them as wanted."""

    def change(fresh: KubeObject) -> dict[str, Any] | None:
        if add and lifecycle.is_deleting(fresh):
            return None  # the API server forbids new finalizers on a deleting object
        wanted = lifecycle.updated_finalizers(fresh, add=add, remove=remove)
        return None if wanted is None else {"metadata": {"finalizers": wanted}}

    return change


def _annotations_change(
    annotations: Mapping[str, str | None],
) -> Callable[[KubeObject], dict[str, Any] | None]:
    """The employer annotations' change (a None value removes one): nothing when a fresh copy
    already carries them (a re-read after a conflict with this controller's own earlier write)."""

    def change(fresh: KubeObject) -> dict[str, Any] | None:
        having = fresh.get("metadata", {}).get("annotations") or {}
        if all(having.get(k) == v for k, v in annotations.items()):
            return None
        return {"metadata": {"annotations": dict(annotations)}}

    return change


async def patch_employer_annotations(
    client: ObjectWriter, resource: Resource, employer: KubeObject, annotations: Mapping[str, str | None]
) -> KubeObject | None:
    """Write the employer's record annotations; the employer as written, or as found when it
    carried them already (None: it is gone)."""
    patched, _ = await _patch_employer(client, resource, employer, _annotations_change(annotations))
    return patched


async def _patch_employer(
    client: ObjectWriter,
    resource: Resource,
    employer: KubeObject,
    change: Callable[[KubeObject], dict[str, Any] | None],
) -> tuple[KubeObject | None, bool]:
    """``change`` the employer under optimistic concurrency, on the event loop's transport
    (resourceconsist.cluster.aiokube; the frame's threads where it cannot serve the client)."""
    meta = employer["metadata"]
    return await aiokube.patch_optimistic(
        client, resource, meta.get("namespace"), meta["name"], change, current=employer
    )


# -- 2. the clean finalizer ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EmployerWrites:
    """How one reconciler reads and writes its employers: its client, their resource, its
    Events, and its own writes of them (podwriter.RecentWrites): their answers, which its cache
    may not show yet (a pass that starts on a pod's event before the echo of the last pass's
    employer write would otherwise plan that write again from the copy before it, into a 409 and
    a re-read), and their echoes, which the controller drops: the pass that wrote went on from
    the answer (docs/concepts.md, "Work proportional to change")."""

    client: ObjectWriter
    resource: Resource
    recorder: EventSink
    reader: ObjectReader
    recent: RecentWrites

    def current(self, namespace: str | None, name: str) -> KubeObject | None:
        """The employer's freshest known copy: the cache's, or the answer to this controller's
        last write of it while the cache still shows a version that write replaced."""
        return self.recent.get(self.reader, namespace, name)

    async def patch_finalizers(
        self, employer: KubeObject, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> tuple[KubeObject | None, bool]:
        """Add/remove employer finalizers under optimistic concurrency: the employer as written or
        as last read (None: gone), and whether it was written."""
        return await self._patch(employer, _finalizers_change(add, remove))

    async def annotations(
        self, employer: KubeObject, annotations: Mapping[str, str | None]
    ) -> KubeObject | None:
        """``patch_employer_annotations``, the answer remembered."""
        patched, _ = await self._patch(employer, _annotations_change(annotations))
        return patched

    async def _patch(
        self, employer: KubeObject, change: Callable[[KubeObject], dict[str, Any] | None]
    ) -> tuple[KubeObject | None, bool]:
        meta = employer["metadata"]
        namespace, name = meta.get("namespace"), meta["name"]
        cached = self.reader.get(self.resource, namespace, name)
        # The pass that writes goes on from the answer: the write's own event is no news to it
        # (podwriter.RecentWrites.event; the controller drops it).
        with self.recent.writing(self.reader, namespace, name):
            patched, wrote = await _patch_employer(self.client, self.resource, employer, change)
            if patched is not None:
                by = kube.object_key(patched) if wrote else ""
                self.recent.wrote(self.reader, namespace, name, cached, employer, patched, by=by)
        return patched, wrote


async def ensure_clean_finalizer(
    employer: KubeObject, writes: EmployerWrites, failures: PassFailures
) -> KubeObject | None:
    """Add the clean finalizer to a live employer that lacks it (dropping the old per-name one).
    The employer the pass goes on with (as written, when it wrote: the pass goes on from the
    answer, as a pass started by the write's own event would); None when the pass stops here, a
    fresher copy found with nothing to write (its watch event brings the next pass)."""
    if lifecycle.is_deleting(employer):
        return employer
    if wire.CLEAN_FINALIZER in lifecycle.get_finalizers(employer):
        return employer
    old = old_clean_finalizer(employer)
    try:
        patched, wrote = await writes.patch_finalizers(employer, add=[wire.CLEAN_FINALIZER], remove=[old])
    except Exception as err:
        raise await failures.fail(
            EventReason.ENSURE_EMPLOYER_CLEAN_FINALIZER_FAILED,
            f"add employer clean finalizer failed: {err}",
        ) from err
    if not wrote or patched is None:
        # Gone, deleting or already guarded on a fresher copy: its watch event brings the next pass.
        return None
    log.info("%s %s: added clean finalizer", failures.controller, failures.key)
    await writes.recorder.event(
        employer,
        "Normal",
        EventReason.ENSURE_EMPLOYER_CLEAN_FINALIZER_SUCCEED,
        "add employer clean finalizer succeed",
    )
    return patched


# -- 3. the employer's entries in its pods ----------------------------------------------------------------


@dataclass
class EntryPlan:
    """The entries one pass plans: the record of who got one as the employer holds it (None:
    the adapter keeps no record), the pods that get the entry, and those that lose it."""

    record: list[str] | None = None
    adds: set[str] = field(default_factory=set)
    removes: set[str] = field(default_factory=set)


async def plan_expected_entries(
    employer: KubeObject,
    *,
    selected: Callable[[], Awaitable[Sequence[str]]],
    keeps_record: bool,
    entry: EmployerEntry,
    pod_of: PodOf,
    writer: PodWriter,
    failures: PassFailures,
    unselected: Iterable[KubeObject] = (),
    changed: Collection[str] | None = None,
) -> EntryPlan:
    """Plan this employer's entry in each pod it selects (removal when deleting) on the pass's
    writer; ``unselected``: pods that may hold the entry though nothing selects them any more
    (the namespace of a gone employer's stand-in), whose entry goes too.

    ``changed`` (``ReconcileContext.changed``): the pods whose events arrived since the last
    pass, which ran to its end; a recorded pod outside it held the entry then and had no event
    since, so only these are read for it (None: every recorded pod is; docs/concepts.md, "Work
    proportional to change")."""
    try:
        names = await selected()
    except Exception as err:
        raise await failures.fail(
            EventReason.ENSURE_EXPECTED_FINALIZER_FAILED,
            f"ensure employees expected finalizer failed: get selected employees' names failed, err: {err}",
        ) from err
    record = record_list(employer, wire.EXPECTED_FINALIZER_ADDED_ANNOTATION) if keeps_record else None

    def has_entry(name: str) -> bool:
        """The cached pod holds the entry (a pod not cached yet counts as holding it: its watch
        event brings it to the next pass)."""
        if changed is not None and name not in changed:
            return True
        pod = pod_of(name)
        # A malformed annotation counts as lacking it; the write reports it.
        return pod is None or holds_entry(pod, entry.key)

    adds, removes = plan_entries(
        names, deleting=lifecycle.is_deleting(employer), recorded=record, has_entry=has_entry
    )
    removes |= {str(pod["metadata"]["name"]) for pod in unselected if holds_entry(pod, entry.key)}
    for name in sorted(adds):
        writer.add_entry(name, entry.key, entry.lifecycle_finalizer)
    for name in sorted(removes):
        writer.remove_entry(name, entry.key)
    return EntryPlan(record, adds, removes)


# -- after the pod writes: what the pods carry, the record annotations, the failures ------------------------


def finalizers_after(written: PodWriteResult, name: str, pod_of: PodOf) -> Sequence[str]:
    """A pod's finalizers after this pass's writes (from the write, else from the cache)."""
    if name in written.finalizers:
        return written.finalizers[name]
    if name in written.done and name not in written.failed:
        return ()  # written to and found gone
    pod = pod_of(name)
    return lifecycle.held_finalizers(pod) if pod is not None else ()


def still_carries(written: PodWriteResult, name: str, pod_of: PodOf, entry: EmployerEntry) -> bool:
    """The pod still carries this employer's guard or lifecycle finalizer after the writes."""
    return guarded(finalizers_after(written, name, pod_of), entry)


@dataclass(frozen=True)
class Records:
    """What the pass's pod writes mean for the employer: the record annotations they changed,
    whether the employer's entries and finalizers are gone from every pod (when deleting;
    True otherwise), and the employer (as written, once ``write_planned`` wrote the records)."""

    annotations: dict[str, str]
    clean: bool
    employer: KubeObject


def records_after_writes(
    employer: KubeObject,
    written: PodWriteResult,
    *,
    plan: EntryPlan,
    lifecycle_record: bool,
    carriers: Collection[str],
    entry: EmployerEntry,
    pod_of: PodOf,
) -> Records | None:
    """The employer's records after the pass's pod writes; None when the writes changed nothing
    a record holds."""
    if not written.done and not written.failed and plan.record is None and not lifecycle_record:
        return None
    clean = True
    if lifecycle.is_deleting(employer):
        clean = all(n in written.done and n not in written.deferred for n in plan.removes) and not any(
            still_carries(written, n, pod_of, entry) for n in carriers
        )
    annotations = record_annotations(
        employer,
        written,
        expected_record=plan.record,
        adds=plan.adds,
        removes=plan.removes,
        lifecycle_record=lifecycle_record,
        carriers=carriers,
        carries_lifecycle=lambda name: entry.lifecycle_finalizer in finalizers_after(written, name, pod_of),
    )
    return Records(annotations, clean, employer)


async def patch_record_annotations(
    employer: KubeObject,
    annotations: dict[str, str],
    writes: EmployerWrites,
    failures: PassFailures,
) -> KubeObject:
    """Write the employer's record annotations; the employer as written (as it was when it is
    gone). A 409 Conflict is left to a quick retry until it outlasts it (``failures``)."""
    try:
        patched = await writes.annotations(employer, annotations)
    except ApiError as err:
        message = f"sync employees failed: patch record annotations failed, err: {err}"
        if isinstance(err, kube.Conflict):
            failure = ("conflict", str(EventReason.SYNC_EMPLOYEES_FAILED), "")
            retrying = await failures.fail_unless_retrying(
                EventReason.SYNC_EMPLOYEES_FAILED, message, [failure]
            )
            # Its cause is the retry it asks for (errors.steering reads the cause chain).
            raise retrying from retrying.__cause__
        raise await failures.fail(EventReason.SYNC_EMPLOYEES_FAILED, message) from err
    return employer if patched is None else patched


async def write_planned(
    employer: KubeObject,
    writer: PodWriter,
    written: PodWriteResult,
    *,
    plan: EntryPlan,
    lifecycle_record: bool,
    carriers: Collection[str],
    entry: EmployerEntry,
    pod_of: PodOf,
    writes: EmployerWrites | None,
    failures: PassFailures,
) -> Records | None:
    """Write each pod the pass planned once (its outcome merged into ``written``), then the
    employer's record annotations (``writes`` None: the employer is not written, as for a gone
    employer's stand-in). The records, with the employer as written; None when the writes
    changed nothing a record holds. The pod writes' failures are the caller's to raise
    (``raise_write_failures``) once it holds the employer as written."""
    if writer.pending:
        written.merge(await writer.flush())
    records = records_after_writes(
        employer,
        written,
        plan=plan,
        lifecycle_record=lifecycle_record,
        carriers=carriers,
        entry=entry,
        pod_of=pod_of,
    )
    if records is None or not records.annotations or writes is None:
        return records
    patched = await patch_record_annotations(employer, records.annotations, writes, failures)
    return dataclasses.replace(records, employer=patched)


async def raise_write_failures(
    written: PodWriteResult, entries: Collection[str], failures: PassFailures
) -> None:
    """The pass's error for its failed pod writes, if any: the Go frame's expected-finalizer
    failure when a pod of ``entries`` (the entries planned) failed, else its lifecycle one."""
    entry_failures = {n: e for n, e in written.failed.items() if n in entries}
    if entry_failures:
        name, err = sorted(entry_failures.items())[0]
        raise await failures.pod_writes_failed(
            EventReason.ENSURE_EXPECTED_FINALIZER_FAILED,
            f"ensure employees expected finalizer failed: pod {name}: {err}"
            + (f" (and {len(entry_failures) - 1} more pods)" if len(entry_failures) > 1 else ""),
            entry_failures,
        )
    if written.failed:
        name, err = sorted(written.failed.items())[0]
        raise await failures.pod_writes_failed(
            EventReason.SYNC_EMPLOYEES_FAILED,
            f"sync employees failed: ensureLifecycleFinalizer failed, err: pod {name}: {err}",
            written.failed,
        )


# -- 6. releasing the clean finalizer --------------------------------------------------------------------


async def release_clean_finalizer(
    employer: KubeObject, writes: EmployerWrites, failures: PassFailures
) -> bool:
    """Drop the clean finalizer (and the old per-name one) of a deleting employer the provider
    is clean of; True when written."""
    obsolete = [wire.CLEAN_FINALIZER, old_clean_finalizer(employer)]
    try:
        if not (await writes.patch_finalizers(employer, remove=obsolete))[1]:
            return False
    except Exception as err:
        raise await failures.fail(
            EventReason.CLEAN_EMPLOYER_CLEAN_FINALIZER_FAILED,
            f"clean employer clean-finalizer failed: {err}",
        ) from err
    log.info("%s %s: provider side clean, released clean finalizer", failures.controller, failures.key)
    await writes.recorder.event(
        employer,
        "Normal",
        EventReason.CLEAN_EMPLOYER_CLEAN_FINALIZER_SUCCEED,
        "clean employer clean finalizer succeed",
    )
    return True
