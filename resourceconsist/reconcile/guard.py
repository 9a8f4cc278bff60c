"""The guard (docs/concepts.md, "The guard"): which pods must carry this employer's guard before
the provider is called (``before_calls``, which writes them at once), and, from what the
provider confirmed after the calls, each pod's verdict and the finalizer swaps and releases it
plans (``after_calls``). Apart from ``before_calls``, every function here decides and plans on
the pass's ``PodWriter``; the orchestrator (resourceconsist/reconcile/reconciler.py) writes.
"""

from __future__ import annotations

import itertools
import logging
import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from resourceconsist import wire
from resourceconsist.adapter import CUDResults, Employee, PodEmployeeStatuses
from resourceconsist.reconcile.finalizers import PodOf, guarded, holds_entry, still_carries
from resourceconsist.reconcile.memory import GuardMemo
from resourceconsist.reconcile.podwriter import EmployerEntry, PodWriter, PodWriteResult
from resourceconsist.rules import lifecycle
from resourceconsist.rules.diff import Diff

log = logging.getLogger(__package__)

#: An item's pod name, as a C-level getter: some sets of a pass are built over every item.
_name = operator.attrgetter("name")


class Verdict(IntEnum):
    """What the provider's confirmed state means for one pod's finalizers after the calls.

    Ordered by caution: when several items name one pod, the most cautious verdict wins."""

    IDLE = 0  # the provider holds nothing that may route to it: release guard and lifecycle finalizer
    SERVED = 1  # registered and lifecycle-ready: guard swapped for the lifecycle finalizer
    ROUTING = 2  # registered, not ready: lifecycle finalizer swapped for the guard
    UNKNOWN = 3  # a call failed or was skipped: the outcome is unknown, change nothing


class GuardRecall:
    """One pass's use of the ``GuardMemo`` of the employer's last pass (docs/concepts.md, "Work
    proportional to change"): a pod that had no event since that pass ran to its end is as that
    pass found it, so what the pass read of it holds without reading it again; ``now`` is filled
    with what this pass finds, for the next one.

    ``changed`` tells which pods had an event since then, asked at the moment of each use (the
    events of this pass's own writes and of pods that changed during it count as they arrive);
    it answers None when the pass must read every pod (a full pass, or the employer changed)."""

    def __init__(self, last: GuardMemo | None, changed: Callable[[], Collection[str] | None]) -> None:
        #: Whether anything is known of the last pass (None: every pod is read).
        self._known = last is not None
        self._last = last if last is not None else GuardMemo()
        self._changed = changed
        self.now = GuardMemo()

    def _changed_now(self) -> Collection[str] | None:
        """The pods with an event since the last pass that ran to its end, as of now; None when
        no pod may be taken as that pass found it."""
        return self._changed() if self._known else None

    def still_guarded(self, names: set[str]) -> set[str]:
        """Of ``names``, the pods that carried the guard or lifecycle finalizer at the last pass
        and had no event since. In bulk, as of one moment: a pass asks it of every pod."""
        changed = self._changed_now()
        if changed is None:
            return set()
        return (names & self._last.guarded).difference(changed)

    def still_settled(self, verdicts: Mapping[str, Verdict]) -> dict[str, Verdict]:
        """Of ``verdicts``, the pods whose finalizers matched this same verdict at the last pass
        and that had no event since, with their verdict (in bulk, as ``still_guarded``)."""
        changed = self._changed_now()
        if changed is None:
            return {}
        last = self._last.settled.get
        return {n: v for n, v in verdicts.items() if last(n) is v and n not in changed}

    def found(self, written: Collection[str]) -> GuardMemo:
        """What this pass found, for the next one, but for the pods it wrote or tried to write
        (``written``): their finalizers may differ from what it found before its writes, and the
        events of those writes may reach the next pass late."""
        return GuardMemo(
            guarded=self.now.guarded.difference(written),
            settled={name: v for name, v in self.now.settled.items() if name not in written},
        )


def no_recall() -> GuardRecall:
    """A pass that remembers nothing and reads every pod (a stand-in's, a full one, tests)."""
    return GuardRecall(None, lambda: None)


def plan_guard(
    held: Iterable[str],
    registering: Iterable[str],
    pod_of: PodOf,
    entry: EmployerEntry,
    writer: PodWriter,
    recall: GuardRecall | None = None,
) -> tuple[set[str], int]:
    """Plan the guard on every pod the provider holds (``held``) or is about to hold
    (``registering``) a registration of, that lacks it; the pods planned, and how many
    registrations the provider held without their pod's guard (the invariant, live). A pod
    ``recall`` knows carried it and had no event since is not read again."""
    recall = recall or no_recall()
    held = set(held)
    names = held | set(registering)
    remembered = recall.still_guarded(names)
    recall.now.guarded |= remembered
    unguarded = 0
    guarding: set[str] = set()
    for name in sorted(names - remembered):
        pod = pod_of(name)
        if pod is not None and guarded(lifecycle.held_finalizers(pod), entry):
            recall.now.guarded.add(name)
            continue
        if pod is not None and name in held:
            unguarded += 1  # the provider's view and the cache: the invariant, live
        writer.add_finalizer(name, entry.guard_finalizer)
        guarding.add(name)
    return guarding, unguarded


def judge(
    results: CUDResults[Employee], current_by_id: Mapping[str, Any]
) -> tuple[dict[str, Verdict], set[str]]:
    """Each pod's verdict from what the provider confirmed, and the pods it serves: a confirmed
    item ``serves()`` and their verdict is SERVED (for the readiness gates). One pod may be
    named by several items: the most cautious verdict wins."""
    # A steady pass judges every pod (docs/benchmarks.md, "A pass's fixed cost"): one loop over
    # the items, with no call of our own per item and the verdicts in locals.
    idle, served, routing, unknown = Verdict.IDLE, Verdict.SERVED, Verdict.ROUTING, Verdict.UNKNOWN
    serves: set[str] = set()
    verdicts: dict[str, Verdict] = {}
    before_of = verdicts.get
    again: list[str] = []  # pods named by more than one item
    held_by_id = current_by_id.get
    # (items, their verdict when it does not depend on the item, whether they were called for):
    # an item called for is its own confirmation; an unchanged one is judged by the provider's
    # own item, which says whether it holds a registration.
    groups: list[tuple[list[Employee], Verdict | None, bool]] = [
        ([*results.succ_created, *results.succ_updated], None, True),
        (results.unchanged, None, False),
        (results.succ_deleted, idle, True),
        (results.failed, unknown, True),
    ]
    for items, fixed, called in groups:
        for item in items:
            name = item.name
            if fixed is not None:
                verdict = fixed
            else:
                held = item if called else held_by_id(item.id)
                if held is None:
                    held = item
                if not held.registered():
                    verdict = idle
                else:
                    statuses = item.statuses
                    if isinstance(statuses, PodEmployeeStatuses) and statuses.lifecycle_ready:
                        verdict = served
                        if name and held.serves():
                            serves.add(name)
                    else:
                        verdict = routing
            if name:
                before = before_of(name)
                if before is None:
                    verdicts[name] = verdict
                else:
                    again.append(name)
                    if verdict > before:
                        verdicts[name] = verdict
    # Only a pod named twice can end with a verdict other than the one its serving item gave.
    serves.difference_update([name for name in again if verdicts[name] is not served])
    return verdicts, serves


def plan_after_calls(
    judged: Mapping[str, Verdict],
    carriers: Iterable[str],
    entry: EmployerEntry,
    pod_of: PodOf,
    writer: PodWriter,
    recall: GuardRecall | None = None,
) -> dict[str, Verdict]:
    """Plan each pod's guard and lifecycle finalizer from what the provider confirmed; the
    verdicts, the carriers the provider holds nothing for included (IDLE). A pod ``recall``
    knows matched the same verdict and had no event since is not read again."""
    recall = recall or no_recall()
    carriers = set(carriers)
    verdicts = dict(judged)
    # Pods carrying our finalizers that the provider holds nothing for: release them,
    # whatever removed their backends (delete_employer, a person, the provider).
    verdicts.update(dict.fromkeys(carriers.difference(verdicts), Verdict.IDLE))
    # As the last pass found them, unless something is planned for them (a pod's plan here
    # touches that pod alone, so asking before the loop answers as asking in it would). Set
    # operations over all pods, a loop over the others (docs/benchmarks.md, "A pass's fixed cost").
    remembered = recall.still_settled(verdicts)
    for name in writer.planned_names() & remembered.keys():
        del remembered[name]
    recall.now.settled.update(remembered)
    for name in sorted(verdicts.keys() - remembered.keys()):
        verdict = verdicts[name]
        if verdict is Verdict.SERVED or verdict is Verdict.ROUTING:
            on, off = entry.lifecycle_finalizer, entry.guard_finalizer
            if verdict is Verdict.ROUTING:
                on, off = off, on
            if swapped(name, on, off, entry, pod_of, writer):
                recall.now.settled[name] = verdict
            else:
                writer.swap(name, to_lifecycle=verdict is Verdict.SERVED)
        elif verdict is Verdict.IDLE and name in carriers:
            writer.remove_finalizer(name, entry.lifecycle_finalizer)
            writer.remove_finalizer(name, entry.guard_finalizer)
    return verdicts


def settled(results: CUDResults[Employee], pending: Iterable[Employee]) -> set[str]:
    """The pods whose verdict the calls answered so far already decide: every item naming the
    pod was called and confirmed. A pod an item still to be called names, one an unchanged
    item names (judged from the provider's current items at the end) and one a failed or held
    back item names wait for the pass's end (``after_calls``)."""
    confirmed = {i.name for i in [*results.succ_created, *results.succ_updated, *results.succ_deleted]}
    waiting = [*pending, *results.unchanged, *results.fail_created, *results.fail_updated]
    return confirmed - {i.name for i in [*waiting, *results.fail_deleted]} - {""}


def plan_settled(
    results: CUDResults[Employee],
    names: set[str],
    carriers: Iterable[str],
    entry: EmployerEntry,
    pod_of: PodOf,
    writer: PodWriter,
) -> None:
    """Plan the swaps and releases of ``names`` (pods ``settled`` says are decided) as
    ``after_calls`` will plan them: the same verdicts from the same confirmed items, so the pass
    writes them as soon as their registration is confirmed (docs/concepts.md, "The guard")."""
    mine: CUDResults[Employee] = CUDResults(
        succ_created=[i for i in results.succ_created if i.name in names],
        succ_updated=[i for i in results.succ_updated if i.name in names],
        succ_deleted=[i for i in results.succ_deleted if i.name in names],
    )
    verdicts, _ = judge(mine, {})
    plan_after_calls(verdicts, set(carriers) & names, entry, pod_of, writer)


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
    held = lifecycle.held_finalizers(pod)
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
    for name, verdict in verdicts.items():
        last = told.get(name)
        if verdict is Verdict.SERVED:
            what = "pod_served"
        elif verdict is Verdict.ROUTING:
            what = "pod_drained" if last in ("pod_served", "pod_drained") else "pod_guarded"
        elif verdict is Verdict.IDLE and last is not None:
            what = "pod_released"
        else:
            continue
        if what == last:
            # Told already: a steady pass over 1000 served pods reads no pod's finalizers.
            continue
        finalizers = finalizers_of(name)
        if what == "pod_served":
            made_true = entry.lifecycle_finalizer in finalizers
        elif what == "pod_released":
            made_true = not guarded(finalizers, entry)
        else:
            made_true = guarded(finalizers, entry)
        if made_true:
            found.append((name, what))
    found.sort()
    return found


def carries_guard(name: str, written: PodWriteResult, pod_of: PodOf, entry: EmployerEntry) -> bool:
    """Pod ``name`` may be registered: its writes did not fail and it carries this employer's
    guard or lifecycle finalizer after them (``before_calls``; a pass that plans again asks the
    same of each item it calls for)."""
    return name not in written.failed and still_carries(written, name, pod_of, entry)


@dataclass(frozen=True)
class Guarding:
    """What the guard before the calls did: the pods whose writes left them carrying this
    employer's guard or lifecycle finalizer, those it guarded (in order), and the ids of the
    creates/updates that must wait because their pod could not be guarded."""

    carrying: set[str]
    guarding: list[str]
    blocked: set[str]


async def before_calls(
    planned: Diff[Employee],
    current: Sequence[Employee],
    *,
    entry: EmployerEntry,
    pod_of: PodOf,
    writer: PodWriter,
    written: PodWriteResult,
    report_unguarded: Callable[[int], None],
    controller: str,
    key: str,
    recall: GuardRecall | None = None,
) -> Guarding:
    """Guard every pod the provider holds, or is about to hold, a registration of, before any
    call (folding the writes into ``written``, the pass's); ``report_unguarded`` gets how many
    registrations the provider held without their pod's guard.

    Entries planned in step 3 go out in the same write, so a new pod costs one write. A
    registration found without its guard (a crash between a call and its write) is guarded
    here, before anything else (docs/concepts.md, "The guard")."""
    held = {item.name for item in current if item.name and item.registered()}
    registering = {
        e.name: e.id for e in [*planned.to_create, *planned.to_update] if e.name and e.registered()
    }
    guarding, unguarded = plan_guard(held, registering, pod_of, entry, writer, recall)
    report_unguarded(unguarded)
    # Additions go out now; removals wait for the calls (an entry stays while its
    # lifecycle finalizer does).
    adding = writer.adding()
    if adding:
        written.merge(await writer.flush(only=adding))
    blocked = {
        item_id for name, item_id in registering.items() if not carries_guard(name, written, pod_of, entry)
    }
    if blocked:
        log.info(
            "%s %s: not registering %d employees whose pods could not be guarded yet",
            controller,
            key,
            len(blocked),
        )
    return Guarding(
        carrying={n for n, f in written.finalizers.items() if guarded(f, entry)},
        guarding=[n for n in sorted(guarding) if guarded(written.finalizers.get(n, []), entry)],
        blocked=blocked,
    )


@dataclass(frozen=True)
class AfterCalls:
    """What the provider confirmed of the employer's pods: each pod's verdict (the carriers it
    holds nothing for included; none when the employer does not follow PodOpsLifecycle), the
    pods it serves, those whose outcome is unknown, and the names it is expected to hold."""

    verdicts: dict[str, Verdict]
    serving: set[str]
    unknown: set[str]
    employed: set[str]


def after_calls(
    results: CUDResults[Employee],
    current_by_id: Mapping[str, Any],
    *,
    follows_lifecycle: bool,
    carriers: Iterable[str],
    entry: EmployerEntry,
    pod_of: PodOf,
    writer: PodWriter,
    recall: GuardRecall | None = None,
) -> AfterCalls:
    """Judge each pod from what the provider confirmed and, when the employer follows
    PodOpsLifecycle, plan its swaps and releases (``plan_after_calls``)."""
    verdicts, serving = judge(results, current_by_id)
    planned = plan_after_calls(verdicts, carriers, entry, pod_of, writer, recall) if follows_lifecycle else {}
    expected = (results.succ_created, results.fail_created, results.succ_updated, results.fail_updated)
    employed = set(map(_name, itertools.chain(*expected, results.unchanged)))
    employed.discard("")
    return AfterCalls(
        verdicts=planned,
        serving=serving,
        # UNKNOWN, the most cautious verdict, comes from a failed item alone.
        unknown={i.name for i in results.failed if i.name},
        employed=employed,
    )


def removes_traffic(carriers: Iterable[str], selected: set[str], pod_of: PodOf) -> bool:
    """Whether a pass takes traffic off one of the pods carrying the employer's guard or
    lifecycle finalizer (``carriers``), as the cache tells before any provider call: one is
    gone or deleting, is no longer selected, or PodOpsLifecycle took it out of service. Such a
    pass spends the provider budget at removal priority (docs/concepts.md, "The provider budget")."""
    for name in carriers:
        pod = pod_of(name)
        if name not in selected or pod is None or lifecycle.is_deleting(pod):
            return True
        service_ready = lifecycle.pod_condition(pod, wire.SERVICE_READY_CONDITION)
        if service_ready is not None and service_ready.get("status") == "False":
            return True
    return False
