"""The finalizers and records that keep the promise (docs/concepts.md, "The finalizers and what
they protect"): the employer's clean finalizer, its entry in each selected pod's
``available-conditions`` (and the record of who got it), and the employer's record annotations.

What to plan is decided here from what the pass read (``plan_entries``, ``record_annotations``);
the employer's own writes (``patch_employer_finalizers``, ``patch_employer_annotations``) run in
the frame's threads, never the adapters' (resourceconsist.cancellation).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Collection, Sequence
from typing import Any

from resourceconsist import lifecycle, wire
from resourceconsist.interfaces import ObjectWriter
from resourceconsist.kube import KubeObject, Resource
from resourceconsist.podwriter import PodWriteResult


def old_clean_finalizer(employer: KubeObject) -> str:
    """The per-name clean finalizer older versions of the Go frame put on the employer."""
    return wire.OLD_CLEAN_FINALIZER_PREFIX + str(employer["metadata"]["name"])


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


async def patch_employer_finalizers(
    client: ObjectWriter,
    resource: Resource,
    employer: KubeObject,
    *,
    add: Sequence[str] = (),
    remove: Sequence[str] = (),
) -> bool:
    """Add/remove employer finalizers under optimistic concurrency; True when written."""

    def change(fresh: KubeObject) -> dict[str, Any] | None:
        if add and lifecycle.is_deleting(fresh):
            return None  # the API server forbids new finalizers on a deleting object
        wanted = lifecycle.updated_finalizers(fresh, add=add, remove=remove)
        return None if wanted is None else {"metadata": {"finalizers": wanted}}

    _, wrote = await _patch_employer(client, resource, employer, change)
    return bool(wrote)


async def patch_employer_annotations(
    client: ObjectWriter, resource: Resource, employer: KubeObject, annotations: dict[str, str]
) -> KubeObject | None:
    """Write the employer's record annotations; the employer as written (None: it is gone)."""
    patched, _ = await _patch_employer(
        client, resource, employer, lambda fresh: {"metadata": {"annotations": annotations}}
    )
    return patched


async def _patch_employer(
    client: ObjectWriter,
    resource: Resource,
    employer: KubeObject,
    change: Callable[[KubeObject], dict[str, Any] | None],
) -> tuple[KubeObject | None, bool]:
    """``change`` the employer under optimistic concurrency, in the frame's own threads."""
    meta = employer["metadata"]
    return await asyncio.to_thread(
        functools.partial(client.patch_optimistic, current=employer),
        resource,
        meta.get("namespace"),
        meta["name"],
        change,
    )
