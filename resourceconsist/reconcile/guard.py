"""The guard (docs/concepts.md, "The guard"): which pods must carry this employer's guard before
the provider is called, and, from what the provider confirmed after the calls, each pod's
verdict and the finalizer swaps and releases it plans. Every function here decides and plans
(on the pass's ``PodWriter``); the orchestrator (resourceconsist/reconcile/reconciler.py) writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import IntEnum
from typing import Any

from resourceconsist import lifecycle
from resourceconsist.adapter import CUDResults, Employee, PodEmployeeStatuses
from resourceconsist.kube import KubeObject
from resourceconsist.podwriter import EmployerEntry, PodWriter

#: A pod employee's freshest copy (the pass's cache, with its own recent writes), or None.
PodOf = Callable[[str], KubeObject | None]


class Verdict(IntEnum):
    """What the provider's confirmed state means for one pod's finalizers after the calls.

    Ordered by caution: when several items name one pod, the most cautious verdict wins."""

    IDLE = 0  # the provider holds nothing that may route to it: release guard and lifecycle finalizer
    SERVED = 1  # registered and lifecycle-ready: guard swapped for the lifecycle finalizer
    ROUTING = 2  # registered, not ready: lifecycle finalizer swapped for the guard
    UNKNOWN = 3  # a call failed or was skipped: the outcome is unknown, change nothing


def holds_entry(pod: KubeObject, key: str) -> bool:
    """The pod's ``available-conditions`` hold the entry ``key`` (a malformed one counts as not)."""
    try:
        return key in lifecycle.expected_finalizers(pod)
    except lifecycle.MalformedAvailableConditions:
        return False


def guarded(finalizers: Sequence[str], entry: EmployerEntry) -> bool:
    """The finalizers hold this employer's guard or lifecycle finalizer."""
    return entry.guard_finalizer in finalizers or entry.lifecycle_finalizer in finalizers


def plan_guard(
    held: Iterable[str], registering: Iterable[str], pod_of: PodOf, entry: EmployerEntry, writer: PodWriter
) -> tuple[set[str], int]:
    """Plan the guard on every pod the provider holds (``held``) or is about to hold
    (``registering``) a registration of, that lacks it; the pods planned, and how many
    registrations the provider held without their pod's guard (the invariant, live)."""
    held = set(held)
    unguarded = 0
    guarding: set[str] = set()
    for name in sorted(held | set(registering)):
        pod = pod_of(name)
        if pod is not None and guarded(lifecycle.get_finalizers(pod), entry):
            continue
        if pod is not None and name in held:
            unguarded += 1  # the provider's view and the cache: the invariant, live
        writer.add_finalizer(name, entry.guard_finalizer)
        guarding.add(name)
    return guarding, unguarded


def judge(
    results: CUDResults[Employee], current_by_id: Mapping[str, Any]
) -> tuple[dict[str, Verdict], set[str]]:
    """Each pod's verdict from what the provider confirmed, and the pods a confirmed item
    ``serves()`` (for the readiness gates)."""
    verdicts: dict[str, Verdict] = {}
    serves: set[str] = set()

    def judged(name: str, verdict: Verdict) -> None:
        if name:
            verdicts[name] = max(verdicts.get(name, Verdict.IDLE), verdict)

    def confirmed(item: Employee, held: Employee) -> Verdict:
        if not held.registered():
            return Verdict.IDLE
        ready = isinstance(item.statuses, PodEmployeeStatuses) and item.statuses.lifecycle_ready
        if ready and held.serves():
            serves.add(item.name)
        return Verdict.SERVED if ready else Verdict.ROUTING

    for item in [*results.succ_created, *results.succ_updated]:
        judged(item.name, confirmed(item, item))
    for item in results.unchanged:
        # The provider's own item says whether it holds a registration.
        held = current_by_id.get(item.id)
        judged(item.name, confirmed(item, held if held is not None else item))
    for item in results.succ_deleted:
        judged(item.name, Verdict.IDLE)
    for item in [*results.fail_created, *results.fail_updated, *results.fail_deleted]:
        judged(item.name, Verdict.UNKNOWN)
    return verdicts, serves


def plan_after_calls(
    judged: Mapping[str, Verdict],
    carriers: Iterable[str],
    entry: EmployerEntry,
    pod_of: PodOf,
    writer: PodWriter,
) -> dict[str, Verdict]:
    """Plan each pod's guard and lifecycle finalizer from what the provider confirmed; the
    verdicts, the carriers the provider holds nothing for included (IDLE)."""
    carriers = set(carriers)
    verdicts = dict(judged)
    # Pods carrying our finalizers that the provider holds nothing for: release them,
    # whatever removed their backends (delete_employer, a person, the provider).
    for name in carriers:
        verdicts.setdefault(name, Verdict.IDLE)
    for name, verdict in sorted(verdicts.items()):
        if verdict is Verdict.SERVED:
            if not swapped(name, entry.lifecycle_finalizer, entry.guard_finalizer, entry, pod_of, writer):
                writer.swap(name, to_lifecycle=True)
        elif verdict is Verdict.ROUTING:
            if not swapped(name, entry.guard_finalizer, entry.lifecycle_finalizer, entry, pod_of, writer):
                writer.swap(name, to_lifecycle=False)
        elif verdict is Verdict.IDLE and name in carriers:
            writer.remove_finalizer(name, entry.lifecycle_finalizer)
            writer.remove_finalizer(name, entry.guard_finalizer)
    return verdicts


def swapped(name: str, on: str, off: str, entry: EmployerEntry, pod_of: PodOf, writer: PodWriter) -> bool:
    """The pod already holds ``on`` without ``off`` (and the entry the lifecycle finalizer
    needs), and nothing else is planned for it: the swap would write nothing, so it is not
    planned (a steady pass over 1000 served pods plans nothing). Anything unusual (a
    deleting or uncached pod, a malformed annotation) goes through the writer as before."""
    if writer.planned(name):
        return False
    pod = pod_of(name)
    if pod is None or lifecycle.is_deleting(pod):
        return False
    held = lifecycle.get_finalizers(pod)
    if on not in held or off in held:
        return False
    return on != entry.lifecycle_finalizer or holds_entry(pod, entry.key)


def announcements(
    verdicts: Mapping[str, Verdict],
    told: Mapping[str, str],
    finalizers_of: Callable[[str], Sequence[str]],
    entry: EmployerEntry,
) -> list[tuple[str, str]]:
    """(pod, what) for each change of a pod's state that the pass's verdicts and the pod's
    finalizers after its writes (``finalizers_of``) made true, for the lifecycle subscribers
    (docs/lifecycle-hooks.md, "Subscribers"); ``told``: what they were last told, by pod."""
    found: list[tuple[str, str]] = []
    for name, verdict in sorted(verdicts.items()):
        finalizers = finalizers_of(name)
        last = told.get(name)
        if verdict is Verdict.SERVED and entry.lifecycle_finalizer in finalizers:
            found.append((name, "pod_served"))
        elif verdict is Verdict.ROUTING and guarded(finalizers, entry):
            found.append((name, "pod_drained" if last in ("pod_served", "pod_drained") else "pod_guarded"))
        elif verdict is Verdict.IDLE and last is not None and not guarded(finalizers, entry):
            found.append((name, "pod_released"))
    return found
