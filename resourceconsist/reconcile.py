"""One reconcile of one employer, in the order of docs/concepts.md ("One reconcile").

Each step is one method of ``Reconciler``:

1. ``reconcile``            read the employer from the cache; gone: done.
2. ``_ensure_clean_finalizer``  add the clean finalizer (dropping the old per-name one) and stop.
3. ``_plan_expected_finalizers`` plan this employer's entry in each selected pod's
   ``available-conditions`` (removal when deleting; record mode tracks who got it).
4. ``_sync_employer``        diff expected vs current employer items; create, update, delete.
5. ``_sync_employees``       the same for employees, guarded: ``_guard_before_calls`` puts the
   guard finalizer on every pod the provider holds or is about to hold *before* the calls;
   ``_plan_after_calls`` then adds the lifecycle finalizer where the provider confirmed it
   serves a ready pod, and releases both only where it confirmed it holds nothing.
   ``_write``                 write each planned pod once, then the employer's record annotations.
   ``_update_gates``          set this employer's readiness gate on the pods that carry it, from
   what the provider confirmed (docs/zero-downtime.md).
6. ``_release_clean_finalizer`` deleting and clean: drop the clean finalizer.
7. statuses after success, error conditions after failure (in ``reconcile``).
8. failed items without an error: requeue after the adapter's interval, or a rate-limited retry.

Event reasons and messages are the Go frame's, so dashboards and alerts carry over. The guard
invariant these steps keep is written down in docs/concepts.md, "The guard".
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, TypeVar, cast

from resourceconsist import gates, kube, lifecycle, wire
from resourceconsist.adapter import (
    CUDResults,
    Employee,
    Employer,
    EmployerRequeueOptions,
    ExpectedFinalizerRecordOptions,
    ItemFailure,
    MultiClusterOptions,
    PodEmployeeStatuses,
    ReconcileAdapter,
    ReconcileContext,
    ReconcileLifecycleOptions,
    ReconcileRequeueOptions,
    StatusRecordOptions,
)
from resourceconsist.cancellation import call_adapter, current_cancellation
from resourceconsist.diff import Diff, diff
from resourceconsist.errors import ResourceConsistError, RetryAfter
from resourceconsist.interfaces import EventSink, ObjectReader, ObjectWriter
from resourceconsist.kube import ApiError, KubeObject, Resource
from resourceconsist.podwriter import EmployerEntry, PodLocation, PodWriter, PodWriteResult, RecentWrites
from resourceconsist.wire import EventReason

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The default of ``Reconciler.full_pass_every``: an employer's memo is rebuilt at least this often.
DEFAULT_FULL_PASS_EVERY = 300.0
#: The defaults of ``Reconciler.warn_after_passes`` and ``warn_after_seconds``: a failure left to
#: retries (a 409 Conflict, an item the provider refused) becomes a Warning Event once the same
#: failure was met on this many consecutive passes of the employer, over at least this long
#: (docs/concepts.md, "When a failure becomes a Warning").
DEFAULT_WARN_AFTER_PASSES = 3
DEFAULT_WARN_AFTER_SECONDS = 20.0
#: At most this many item failures of one pass become Warning Events (the rest are counted).
MAX_ITEM_WARNINGS = 5
#: A pass that met only 409 Conflicts is tried again after 0.1 s, doubling with each consecutive
#: conflicting pass up to this many seconds (jittered), not after the controller's exponential
#: backoff: another writer is busy, not broken, and 1000 s would leave pods unguarded for long.
MAX_CONFLICT_RETRY_SECONDS = 5.0


@dataclass
class Result:
    """What the controller does next with the key: nothing, or add it again after a delay."""

    requeue_after: float | None = None
    #: A stand-in pass (``reconcile(key, stand_in=...)``): the provider holds nothing any more.
    collected: bool = False


class ReconcileError(ResourceConsistError):
    """A failed reconcile, already reported as an Event; the controller retries with backoff."""

    def __init__(self, reason: EventReason | None, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class SyncFailedExist(ResourceConsistError):
    """Some create/update/delete failed without an error and no requeue interval is set."""

    def __init__(self) -> None:
        super().__init__("employer or employees synced failed exist")


@dataclass
class _Pass:
    """State of one reconcile pass."""

    employer: KubeObject
    ctx: ReconcileContext
    writer: PodWriter
    key: str
    deleting: bool
    follows_lifecycle: bool
    expected_key: str = ""
    lifecycle_finalizer: str = ""
    guard_finalizer: str = ""
    selected: list[str] | None = None
    expected_clean: bool = True
    expected_added_record: list[str] | None = None
    expected_adds: set[str] = field(default_factory=set)
    expected_removes: set[str] = field(default_factory=set)
    #: Pods that carry (or may carry) this employer's guard or lifecycle finalizer.
    carriers: set[str] = field(default_factory=set)
    lifecycle_record: bool = False
    written: PodWriteResult = field(default_factory=PodWriteResult)
    current_by_id: dict[str, Any] = field(default_factory=dict)
    employer_results: CUDResults[Employer] = field(default_factory=CUDResults)
    employee_results: CUDResults[Employee] = field(default_factory=CUDResults)
    #: Readiness gates: whether the employee sync ran to its end, the names it employs, the
    #: pods the provider confirmed it serves, those whose outcome is unknown, and when the
    #: fail-safe wants the employer looked at again.
    employees_synced: bool = False
    employed: set[str] = field(default_factory=set)
    serving: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)
    gate_recheck: float | None = None
    gate_failures: dict[str, BaseException] = field(default_factory=dict)
    #: A pass over a stand-in of a gone employer (docs/lifecycle-hooks.md, "Orphans"): it
    #: writes nothing to the employer, whose name a new object may already carry.
    stand_in: bool = False
    collected: bool = False
    verdicts: dict[str, _Verdict] = field(default_factory=dict)
    #: Failures left to retries met in this pass (``Reconciler._outlasted``), and the provider's
    #: reason for each pod whose item it refused (for the readiness gates).
    failing: set[tuple[str, ...]] = field(default_factory=set)
    refused: dict[str, str] = field(default_factory=dict)


@dataclass
class _Streak:
    """How long one failure left to retries has lasted: since when, over how many passes."""

    since: float
    passes: int = 0


@dataclass
class EmployerMemory:
    """What the reconciler keeps of one employer between its passes, in one record, so that
    forgetting an employer is one operation (``Reconciler._forget``)."""

    #: The adapter's ``ReconcileContext.memo``.
    memo: dict[str, Any] = field(default_factory=dict)
    #: Employee names whose events arrived since its last pass began; None: the next pass is a
    #: full one (docs/concepts.md, "Work proportional to change").
    changes: set[str] | None = field(default_factory=set)
    #: When its last completed full pass began (monotonic seconds).
    full_pass_at: float | None = None
    #: Registrations the provider held without their pod's guard, as the last pass found them
    #: (the invariant, live: it should read 0; docs/concepts.md); None: not counted yet.
    unguarded: int | None = None
    #: What its subscribers were last told, by pod ("": the employer itself).
    told: dict[str, str] = field(default_factory=dict)
    #: The failures left to retries its consecutive passes met.
    streaks: dict[tuple[str, ...], _Streak] = field(default_factory=dict)


class _Verdict(IntEnum):
    """What the provider's confirmed state means for one pod's finalizers after the calls.

    Ordered by caution: when several items name one pod, the most cautious verdict wins."""

    IDLE = 0  # the provider holds nothing that may route to it: release guard and lifecycle finalizer
    SERVED = 1  # registered and lifecycle-ready: guard swapped for the lifecycle finalizer
    ROUTING = 2  # registered, not ready: lifecycle finalizer swapped for the guard
    UNKNOWN = 3  # a call failed or was skipped: the outcome is unknown, change nothing


def _record_list(obj: KubeObject, annotation: str) -> list[str]:
    value = (obj.get("metadata", {}).get("annotations") or {}).get(annotation, "")
    return [name for name in value.split(",") if name]


class Reconciler:
    """Runs the reconcile steps of one adapter against one (main) cluster."""

    def __init__(
        self,
        adapter: ReconcileAdapter,
        client: ObjectWriter,
        reader: ObjectReader,
        recorder: EventSink,
        employer_resource: Resource,
        employee_resource: Resource,
        clusters: Mapping[str, tuple[ObjectWriter, ObjectReader]] | None = None,
        *,
        api_down: Callable[[], bool] = lambda: False,
        report_unguarded: Callable[[int], None] = lambda total: None,
        report_retried: Callable[[str], None] = lambda reason: None,
        notify: Callable[[str, str, str], None] = lambda what, key, pod: None,
    ) -> None:
        """The hooks (the controller's): ``api_down`` says whether the main cluster's API server
        is known to be unreachable; ``report_unguarded`` gets the sum of ``unguarded`` whenever
        it may have changed, ``report_retried`` the Event reason of each failure left to a retry
        without a Warning (the metrics); ``notify`` gets (what happened, employer key, pod name
        or "") as a pass decides it, each once per change, and must not block
        (docs/lifecycle-hooks.md, "Subscribers")."""
        self.adapter = adapter
        self.client = client
        self.reader = reader
        self.recorder = recorder
        self.employer_resource = employer_resource
        self.employee_resource = employee_resource
        self.clusters = clusters if clusters is not None else {}
        self.name = adapter.get_controller_name()
        # A runtime-checkable protocol's isinstance walks its members: once here, not per pod.
        self._multi_cluster = isinstance(adapter, MultiClusterOptions)
        #: What the reconciler keeps of each employer between passes, by employer key.
        self._memory: dict[str, EmployerMemory] = {}
        #: Seconds after which an employer's next pass is a full one whatever changed
        #: (``ReconcileContext.changed`` None; docs/concepts.md, "Work proportional to change").
        self.full_pass_every: float = DEFAULT_FULL_PASS_EVERY
        self.api_down = api_down
        self.report_unguarded = report_unguarded
        self.notify = notify
        #: Pods written by this reconciler that the cache may not show yet (podwriter.RecentWrites).
        self.recent = RecentWrites()
        #: When a failure left to retries becomes a Warning Event: met on this many consecutive
        #: passes, over at least this many seconds (docs/concepts.md, "When a failure becomes a
        #: Warning"). An adapter error stays a Warning at once, as in the Go original.
        self.warn_after_passes: int = DEFAULT_WARN_AFTER_PASSES
        self.warn_after_seconds: float = DEFAULT_WARN_AFTER_SECONDS
        self.report_retried = report_retried

    # -- capabilities and their defaults ------------------------------------------------------------

    @property
    def employees_are_pods(self) -> bool:
        return self.employee_resource == kube.POD

    @property
    def follows_lifecycle(self) -> bool:
        """The employers' pods carry their marks: entries, guard and lifecycle finalizers."""
        return self._follows_lifecycle()

    def _follows_lifecycle(self) -> bool:
        if not self.employees_are_pods:
            return False
        if isinstance(self.adapter, ReconcileLifecycleOptions):
            return self.adapter.follow_pod_ops_lifecycle()
        return True

    def _records_lifecycle_finalizers(self) -> bool:
        return isinstance(self.adapter, ReconcileLifecycleOptions) and (
            self.adapter.need_record_lifecycle_finalizer_condition()
        )

    def _records_expected_finalizers(self) -> bool:
        return isinstance(self.adapter, ExpectedFinalizerRecordOptions) and (
            self.adapter.need_record_expected_finalizer_condition()
        )

    async def _selected_names(self, p: _Pass, *, fresh: bool = False) -> list[str]:
        """The employees the employer selects, read once per pass (``fresh``: read again, for
        decisions about pods that may have reached the cache since)."""
        if p.selected is None or fresh:
            if isinstance(self.adapter, ReconcileLifecycleOptions):
                selected = list(
                    await call_adapter(self.adapter.get_selected_employee_names, p.ctx, p.employer)
                )
            elif self.employer_resource == kube.SERVICE:
                selected = [pod["metadata"]["name"] for pod in self.reader.pods_selected_by(p.employer)]
            else:
                selected = []
            if p.selected is None:
                p.selected = selected
            return selected
        return p.selected

    def _in_members(self) -> bool:
        """Pod employees live in member clusters (named ``pod#cluster``)."""
        return self._multi_cluster and not cast(MultiClusterOptions, self.adapter).employee_fed()

    def _locate(self, employee_name: str) -> PodLocation:
        """Where a pod employee lives: ``pod#cluster`` in a member cluster, else the main one."""
        if self._in_members():
            pod, sep, cluster = employee_name.rpartition(wire.MULTI_CLUSTER_SEPARATOR)
            if not sep or not pod:
                raise ValueError(f"employee name {employee_name!r} is not <pod>#<cluster>")
            if cluster not in self.clusters:
                raise LookupError(f"employee {employee_name!r}: cluster {cluster!r} is not registered")
            client, reader = self.clusters[cluster]
            return PodLocation(client, reader, pod)
        return PodLocation(self.client, self.reader, employee_name)

    # -- what changed since an employer's last pass (docs/concepts.md, "Work proportional to change") --

    def _memory_of(self, key: str) -> EmployerMemory:
        found = self._memory.get(key)
        if found is None:
            found = self._memory[key] = EmployerMemory()
        return found

    def _told_of(self, key: str) -> dict[str, str]:
        """What subscribers were last told about the employer ``key``, by pod (read only)."""
        found = self._memory.get(key)
        return {} if found is None else found.told

    @property
    def unguarded(self) -> dict[str, int]:
        """Per employer key: registrations the provider held without their pod's guard, as the
        last pass found them (the invariant, live: it should read 0; docs/concepts.md)."""
        return {key: m.unguarded for key, m in self._memory.items() if m.unguarded is not None}

    def employee_changed(self, key: str, name: str) -> None:
        """An event of employee ``name`` (``pod`` or ``pod#cluster``) woke employer ``key``."""
        pending = self._memory_of(key).changes
        if pending is not None:
            pending.add(name)

    def employer_changed(self, key: str) -> None:
        """The employer itself changed (or anything the frame cannot name): a full pass next."""
        self._memory_of(key).changes = None

    def _take_changes(self, key: str) -> frozenset[str] | None:
        """What the pass starting now tells the adapter in ``ReconcileContext.changed``."""
        memory = self._memory_of(key)
        pending, memory.changes = memory.changes, set()
        last_full = memory.full_pass_at
        if pending is None or last_full is None or time.monotonic() - last_full >= self.full_pass_every:
            return None
        return frozenset(pending)

    def _forget(self, key: str) -> None:
        """Drop what the frame keeps of an employer once it is gone or its leftovers were
        collected. What its subscribers were told stays until they are told it is deleted."""
        memory = self._memory.pop(key, None)
        if memory is None:
            return
        if memory.told:
            self._memory[key] = EmployerMemory(told=memory.told)
        if memory.unguarded:
            self.report_unguarded(sum(self.unguarded.values()))

    def context(self, key: str) -> ReconcileContext:
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
            memo=self._memory_of(key).memo if key else {},
        )

    # -- events ---------------------------------------------------------------------------------

    async def _fail(
        self, p: _Pass, reason: EventReason, message: str, annotations: Mapping[str, str] | None = None
    ) -> ReconcileError:
        # While the API server is down the client has said so once; a line per failed pass
        # would repeat it (docs/concepts.md, "What an operator sees under faults").
        level = logging.DEBUG if self.api_down() else logging.WARNING
        log.log(level, "%s %s: %s", self.name, p.key, message)
        await self.recorder.event(p.employer, "Warning", reason, message, annotations)
        return ReconcileError(reason, message)

    # -- failures left to retries (docs/concepts.md, "When a failure becomes a Warning") ------------

    def _outlasted(self, p: _Pass, failures: Sequence[tuple[str, ...]]) -> bool:
        """Count this pass for each failure; True when one of them has now been met on
        ``warn_after_passes`` consecutive passes over at least ``warn_after_seconds``."""
        streaks = self._memory_of(p.key).streaks
        now = time.monotonic()
        outlasted = False
        for failure in failures:
            streak = streaks.setdefault(failure, _Streak(since=now))
            if failure not in p.failing:
                p.failing.add(failure)
                streak.passes += 1
            if streak.passes >= self.warn_after_passes and now - streak.since >= self.warn_after_seconds:
                outlasted = True
        return outlasted

    def _end_streaks(self, p: _Pass) -> None:
        """A failure this pass did not meet again was resolved: its streak ends."""
        memory = self._memory.get(p.key)
        if memory is None:
            return
        for failure in [f for f in memory.streaks if f not in p.failing]:
            del memory.streaks[failure]

    async def _fail_unless_retrying(
        self, p: _Pass, reason: EventReason, message: str, failures: Sequence[tuple[str, ...]]
    ) -> ReconcileError:
        """A failure a retry may resolve (a 409 Conflict): an INFO line and a metric, until the
        same failure outlasts its retries; then the Warning Event of ``_fail``."""
        if self._outlasted(p, failures):
            error = await self._fail(p, reason, message)
        else:
            self.report_retried(reason)
            # The controller logs the retry at INFO with this message: one line per pass.
            error = ReconcileError(reason, message)
        streaks = self._memory_of(p.key).streaks
        passes = max((streaks[f].passes for f in failures if f in streaks), default=1)
        delay = min(MAX_CONFLICT_RETRY_SECONDS, 0.1 * 2 ** (passes - 1)) * random.uniform(0.5, 1.0)
        error.__cause__ = RetryAfter(delay, message)
        return error

    async def _report_refused(self, p: _Pass, side: _Side, results: CUDResults[Any]) -> None:
        """Items the provider refused with a reason (``ReconcileContext.fail_item``): each pod's
        reason goes to its readiness gate; each failure is an INFO line and a metric until it
        outlasts its retries, then a Warning Event in the Go frame's words, annotated with the
        operation, item, code and message for ``resourceconsist explain``. Items failed without
        a reason are "not done yet" (a drain, a cloud controller catching up): never a Warning."""
        refused: list[tuple[str, Any, ItemFailure]] = []
        for label, items in (
            ("syncCreate", results.fail_created),
            ("syncUpdate", results.fail_updated),
            ("syncDelete", results.fail_deleted),
        ):
            for item in items:
                failure = p.ctx.failures.get(item.id)
                if failure is not None:
                    refused.append((label, item, failure))
        warnings: list[tuple[str, Any, ItemFailure]] = []
        for label, item, failure in refused:
            cause = f"{failure.code}: {failure.message}" if failure.code else failure.message
            if side is _EMPLOYEES and item.name:
                p.refused[item.name] = cause
            # The same failure: the same call refused for the same item with the same code.
            if self._outlasted(p, [(side.what, label, item.id, failure.code or failure.message)]):
                warnings.append((label, item, failure))
            else:
                self.report_retried(side.sync_reason)
        if len(warnings) < len(refused):
            label, item, failure = next(r for r in refused if r not in warnings)
            log.info(
                "%s %s: the provider refused %d %s items, retrying; first: %s %s: %s",
                self.name,
                p.key,
                len(refused) - len(warnings),
                side.what,
                label,
                item.id,
                failure.message,
            )
        for label, item, failure in sorted(warnings, key=lambda w: (w[0], w[1].id))[:MAX_ITEM_WARNINGS]:
            cause = f"{failure.code}: {failure.message}" if failure.code else failure.message
            record = {
                "operation": label,
                "item": item.id,
                "name": getattr(item, "name", "") or "",
                "code": failure.code,
                "message": failure.message,
            }
            await self._fail(
                p,
                side.sync_reason,
                f"sync {side.what} failed: {label} failed, err: {item.id}: {cause}",
                {wire.PROVIDER_FAILURE_ANNOTATION: json.dumps(record, sort_keys=True)},
            )

    # -- 1. the whole pass ----------------------------------------------------------------------------

    async def reconcile(self, key: str, *, stand_in: KubeObject | None = None) -> Result:
        """One pass; with ``stand_in`` (a deleting copy of a gone employer), a pass that removes
        what the provider still holds for it (docs/lifecycle-hooks.md, "Orphans")."""
        namespace, _, name = key.rpartition("/")
        employer = stand_in or self.reader.get(self.employer_resource, namespace or None, name)
        if employer is None:
            self._forget(key)
            if self.employees_are_pods:
                await self._release_gates_of_gone_employer(namespace, name)
            if "" in self._told_of(key):
                self._tell(key, "", "employer_deleted")
            return Result()
        follows = self._follows_lifecycle()
        entry: EmployerEntry | None = None
        if follows:
            meta = employer["metadata"]
            entry = EmployerEntry(
                key=lifecycle.expected_finalizer_key(
                    employer.get("kind", ""), meta.get("namespace", ""), meta["name"]
                ),
                lifecycle_finalizer=lifecycle.lifecycle_finalizer(meta["name"]),
                guard_finalizer=lifecycle.guard_finalizer(meta["name"]),
            )
        p = _Pass(
            employer=employer,
            ctx=self.context(key),
            writer=PodWriter(namespace, self._locate, entry, self.recent),
            key=key,
            deleting=lifecycle.is_deleting(employer),
            follows_lifecycle=follows,
        )
        if entry is not None:
            p.expected_key = entry.key
            p.lifecycle_finalizer = entry.lifecycle_finalizer
            p.guard_finalizer = entry.guard_finalizer
        p.stand_in = stand_in is not None
        began = time.monotonic()
        if not p.stand_in:
            p.ctx.changed = self._take_changes(key)
        completed = False
        try:
            if await self._ensure_clean_finalizer(p):
                return Result()
            result = await self._steps(p)
            completed = not (p.employer_results.any_failed or p.employee_results.any_failed)
        except BaseException as err:
            if not isinstance(err, asyncio.CancelledError):
                self._tell(key, "", "employer_failing")
            if p.stand_in:
                raise
            if isinstance(self.adapter, StatusRecordOptions) and not isinstance(err, asyncio.CancelledError):
                try:
                    await call_adapter(self.adapter.record_error_conditions, p.ctx, p.employer, err)
                except Exception as record_err:
                    await self._fail(
                        p,
                        EventReason.RECORD_ERROR_CONDITIONS_FAILED,
                        f"record error conditions failed: {record_err}",
                    )
            raise
        finally:
            self._end_streaks(p)
            if not p.stand_in:
                if not completed:
                    # Whatever the adapter kept from this pass may be wrong: rebuild it next time.
                    self.employer_changed(key)
                elif p.ctx.changed is None:
                    self._memory_of(key).full_pass_at = began
        result.collected = p.collected
        if p.collected:
            self._forget(key)
        if not p.deleting and result.requeue_after is None:
            self._tell(key, "", "employer_converged")
        return result

    def _tell(self, key: str, pod: str, what: str) -> None:
        """Notify subscribers of a change of state of an employer (pod "") or pod, once."""
        told = self._memory_of(key).told
        if told.get(pod) == what:
            return
        if what == "employer_deleted":
            told.clear()
            if self._memory[key] == EmployerMemory():
                del self._memory[key]  # forgotten before: what it was told was all that was left
        elif what == "pod_released":
            told.pop(pod, None)
        else:
            told[pod] = what
        try:
            self.notify(what, key, pod)
        except Exception:
            log.exception("%s %s: notifying subscribers of %s failed", self.name, key, what)

    def _announce(self, p: _Pass) -> None:
        """Tell subscribers what this pass's confirmed verdicts made true, after the writes."""
        for name, verdict in sorted(p.verdicts.items()):
            finalizers = self._final_finalizers(p, name)
            told = self._told_of(p.key).get(name)
            if verdict is _Verdict.SERVED and p.lifecycle_finalizer in finalizers:
                self._tell(p.key, name, "pod_served")
            elif verdict is _Verdict.ROUTING and self._guarded(p, finalizers):
                self._tell(
                    p.key, name, "pod_drained" if told in ("pod_served", "pod_drained") else "pod_guarded"
                )
            elif verdict is _Verdict.IDLE and told is not None and not self._guarded(p, finalizers):
                self._tell(p.key, name, "pod_released")

    async def _steps(self, p: _Pass) -> Result:
        try:
            try:
                await self._plan_expected_finalizers(p)
                await self._sync_employer(p)
                await self._sync_employees(p)
            finally:
                # Pod entries planned before a failed step still land: a pod must list the
                # finalizers it needs even while the provider is failing.
                await self._write(p)
                self._announce(p)
        except Exception:
            # The fail-safe of the readiness gates exists for a failing provider: it still runs.
            await self._update_gates(p)
            raise
        await self._update_gates(p)
        if p.gate_failures:
            name, err = sorted(p.gate_failures.items())[0]
            raise await self._fail(
                p,
                EventReason.UPDATE_READINESS_GATES_FAILED,
                f"update readiness gates failed: pod {name}: {err}"
                + (f" (and {len(p.gate_failures) - 1} more pods)" if len(p.gate_failures) > 1 else ""),
            )
        result = await self._finish(p)
        if p.gate_recheck is not None and (
            result.requeue_after is None or p.gate_recheck < result.requeue_after
        ):
            result.requeue_after = p.gate_recheck
        return result

    async def _finish(self, p: _Pass) -> Result:
        await self._release_clean_finalizer(p)
        if isinstance(self.adapter, StatusRecordOptions) and not p.stand_in:
            try:
                await call_adapter(
                    self.adapter.record_statuses, p.ctx, p.employer, p.employer_results, p.employee_results
                )
            except Exception as err:
                raise await self._fail(
                    p, EventReason.RECORD_STATUSES_FAILED, f"record status failed: {err}"
                ) from err
        if p.employer_results.any_failed or p.employee_results.any_failed:
            if isinstance(self.adapter, EmployerRequeueOptions):
                return Result(requeue_after=self.adapter.employer_requeue_interval(p.ctx, p.employer))
            if isinstance(self.adapter, ReconcileRequeueOptions):
                return Result(requeue_after=self.adapter.employee_sync_requeue_interval())
            raise SyncFailedExist()
        return Result()

    # -- 2. clean finalizer ------------------------------------------------------------------------------

    def _old_clean_finalizer(self, employer: KubeObject) -> str:
        return wire.OLD_CLEAN_FINALIZER_PREFIX + str(employer["metadata"]["name"])

    async def _ensure_clean_finalizer(self, p: _Pass) -> bool:
        """Add the clean finalizer to a live employer that lacks it; True when it wrote."""
        if p.deleting:
            return False
        current = lifecycle.get_finalizers(p.employer)
        if wire.CLEAN_FINALIZER in current:
            return False
        old = self._old_clean_finalizer(p.employer)
        try:
            wrote = await self._patch_employer_finalizers(
                p.employer, add=[wire.CLEAN_FINALIZER], remove=[old]
            )
        except Exception as err:
            raise await self._fail(
                p,
                EventReason.ENSURE_EMPLOYER_CLEAN_FINALIZER_FAILED,
                f"add employer clean finalizer failed: {err}",
            ) from err
        if not wrote:
            # Gone, deleting or already guarded on a fresher copy: its watch event brings the next pass.
            return True
        log.info("%s %s: added clean finalizer", self.name, p.key)
        await self.recorder.event(
            p.employer,
            "Normal",
            EventReason.ENSURE_EMPLOYER_CLEAN_FINALIZER_SUCCEED,
            "add employer clean finalizer succeed",
        )
        return True

    async def _patch_employer_finalizers(
        self, employer: KubeObject, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> bool:
        """Add/remove employer finalizers under optimistic concurrency; True when written."""

        def change(fresh: KubeObject) -> dict[str, Any] | None:
            if add and lifecycle.is_deleting(fresh):
                return None  # the API server forbids new finalizers on a deleting object
            wanted = lifecycle.updated_finalizers(fresh, add=add, remove=remove)
            return None if wanted is None else {"metadata": {"finalizers": wanted}}

        meta = employer["metadata"]
        _, wrote = await asyncio.to_thread(
            functools.partial(self.client.patch_optimistic, current=employer),
            self.employer_resource,
            meta.get("namespace"),
            meta["name"],
            change,
        )
        return bool(wrote)

    # -- 3. expected-finalizer entries ------------------------------------------------------------------

    async def _plan_expected_finalizers(self, p: _Pass) -> None:
        if not p.follows_lifecycle:
            return
        try:
            selected = await self._selected_names(p)
        except Exception as err:
            raise await self._fail(
                p,
                EventReason.ENSURE_EXPECTED_FINALIZER_FAILED,
                "ensure employees expected finalizer failed: "
                f"get selected employees' names failed, err: {err}",
            ) from err
        if self._records_expected_finalizers():
            recorded = _record_list(p.employer, wire.EXPECTED_FINALIZER_ADDED_ANNOTATION)
            p.expected_added_record = recorded
            known = set(recorded)
            if p.deleting:
                p.expected_removes = known | set(selected)
            else:
                p.expected_removes = known - set(selected)
                # The record names pods, not pod instances: a pod re-created under a recorded
                # name lacks the entry, and the record alone would never give it back.
                p.expected_adds = {n for n in selected if n not in known or not self._has_entry(p, n)}
        elif p.deleting:
            p.expected_removes = set(selected)
        else:
            p.expected_adds = set(selected)
        if p.stand_in and not self._in_members():
            # Nothing selects a gone employer's pods any more; its entries would stay on them
            # for ever (docs/lifecycle-hooks.md, "Orphans").
            p.expected_removes |= {
                str(pod["metadata"]["name"])
                for pod in self.reader.list(kube.POD, p.writer.namespace)
                if self._holds_entry(pod, p.expected_key)
            }
        for name in sorted(p.expected_adds):
            p.writer.add_entry(name, p.expected_key, p.lifecycle_finalizer)
        for name in sorted(p.expected_removes):
            p.writer.remove_entry(name, p.expected_key)

    # -- 4. employer -------------------------------------------------------------------------------------

    async def _sync_employer(self, p: _Pass) -> None:
        a = self.adapter
        p.employer_results = await self._sync_side(
            p,
            _EMPLOYER,
            a.get_expected_employer,
            a.get_current_employer,
            (a.create_employer, a.update_employer, a.delete_employer),
        )

    async def _sync_side(
        self,
        p: _Pass,
        side: _Side,
        get_expected: Callable[..., Any],
        get_current: Callable[..., Any],
        cud: tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]],
        before_calls: _BeforeCalls | None = None,
    ) -> CUDResults[Any]:
        """Expected, current, diff and create/update/delete for one side, with the Go events."""
        try:
            expected = list(await call_adapter(get_expected, p.ctx, p.employer))
        except Exception as err:
            raise await self._fail(p, side.expected_reason, f"get expect {side.what} failed: {err}") from err
        try:
            current = list(await call_adapter(get_current, p.ctx, p.employer))
        except Exception as err:
            raise await self._fail(p, side.current_reason, f"get current {side.what} failed: {err}") from err
        try:
            results = await _sync(p, expected, current, *cud, side.what, before_calls)
        except _SyncError as err:
            raise await self._fail(p, side.sync_reason, f"sync {side.what} failed: {err}") from err
        _log_changes(self.name, p.key, side.what, results)
        if results.any_failed:
            await self._report_refused(p, side, results)
        return results

    # -- 5. employees and lifecycle finalizers ------------------------------------------------------------

    async def _sync_employees(self, p: _Pass) -> None:
        a = self.adapter
        results: CUDResults[Employee] = await self._sync_side(
            p,
            _EMPLOYEES,
            a.get_expected_employee,
            a.get_current_employee,
            (a.create_employees, a.update_employees, a.delete_employees),
            self._guard_before_calls if p.follows_lifecycle else None,
        )
        p.employee_results = results
        if not self.employees_are_pods:  # (following PodOpsLifecycle implies pod employees)
            return
        verdicts, serves = self._judge(p, results)
        if p.follows_lifecycle:
            self._plan_after_calls(p, verdicts)
        p.serving = {n for n in serves if verdicts.get(n) is _Verdict.SERVED}
        p.unknown = {n for n, v in verdicts.items() if v is _Verdict.UNKNOWN}
        expected: list[list[Employee]] = [results.succ_created, results.fail_created]
        expected += [results.succ_updated, results.fail_updated, results.unchanged]
        p.employed = {i.name for items in expected for i in items if i.name}
        p.employees_synced = True

    # -- the guard ----------------------------------------------------------------------------------------

    def _pod(self, name: str, namespace: str) -> KubeObject | None:
        where = self._locate(name)
        return self.recent.get(where.reader, namespace, where.name)

    @staticmethod
    def _holds_entry(pod: KubeObject, key: str) -> bool:
        try:
            return key in lifecycle.expected_finalizers(pod)
        except lifecycle.MalformedAvailableConditions:
            return False

    def _has_entry(self, p: _Pass, name: str) -> bool:
        """The cached pod holds this employer's entry (a pod not cached yet counts as holding
        it: its watch event brings it to the next pass)."""
        pod = self._pod(name, p.writer.namespace)
        # A malformed annotation counts as lacking it; the write reports it.
        return pod is None or self._holds_entry(pod, p.expected_key)

    def _guarded(self, p: _Pass, finalizers: Sequence[str]) -> bool:
        return p.guard_finalizer in finalizers or p.lifecycle_finalizer in finalizers

    def _find_carriers(self, p: _Pass) -> set[str]:
        """Pods (``pod`` or ``pod#cluster``) whose cached copy carries this employer's guard or
        lifecycle finalizer: an index lookup, not a scan."""
        namespace = str(p.employer["metadata"].get("namespace") or "")
        wanted = (p.guard_finalizer, p.lifecycle_finalizer)
        if self._in_members():
            return {
                f"{pod['metadata']['name']}{wire.MULTI_CLUSTER_SEPARATOR}{cluster}"
                for cluster, (_, reader) in self.clusters.items()
                for finalizer in wanted
                for pod in reader.pods_with_finalizer(namespace, finalizer)
            }
        return {
            pod["metadata"]["name"] for f in wanted for pod in self.reader.pods_with_finalizer(namespace, f)
        }

    async def _guard_before_calls(
        self, p: _Pass, planned: Diff[Employee], current: Sequence[Employee]
    ) -> set[str]:
        """Guard every pod the provider holds, or is about to hold, a registration of, before any
        call; return the ids of creates/updates that must wait because their pod could not be
        guarded (gone, deleting, or the write failed).

        Entries planned in step 3 go out in the same write, so a new pod costs one write. A
        registration found without its guard (a crash between a call and its write) is guarded
        here, before anything else (docs/concepts.md, "The guard")."""
        namespace = p.writer.namespace
        p.carriers = self._find_carriers(p)
        held = {item.name for item in current if item.name and item.registered()}
        registering = {
            e.name: e.id for e in [*planned.to_create, *planned.to_update] if e.name and e.registered()
        }
        unguarded = 0
        guarding: set[str] = set()
        for name in sorted(held | set(registering)):
            pod = self._pod(name, namespace)
            if pod is not None and self._guarded(p, lifecycle.get_finalizers(pod)):
                continue
            if pod is not None and name in held:
                unguarded += 1  # the provider's view and the cache: the invariant, live
            p.writer.add_finalizer(name, p.guard_finalizer)
            guarding.add(name)
        memory = self._memory_of(p.key)
        if memory.unguarded != unguarded:
            memory.unguarded = unguarded
            self.report_unguarded(sum(self.unguarded.values()))
        # Additions go out now; removals wait for the calls (an entry stays while its
        # lifecycle finalizer does).
        adding = p.writer.adding()
        if adding:
            p.written.merge(await p.writer.flush(only=adding))
        p.carriers |= {n for n, f in p.written.finalizers.items() if self._guarded(p, f)}
        for name in sorted(guarding):
            if self._guarded(p, p.written.finalizers.get(name, [])) and name not in self._told_of(p.key):
                self._tell(p.key, name, "pod_guarded")
        blocked = {
            item_id
            for name, item_id in registering.items()
            if name in p.written.failed or not self._still_carries(p, name)
        }
        if blocked:
            log.info(
                "%s %s: not registering %d employees whose pods could not be guarded yet",
                self.name,
                p.key,
                len(blocked),
            )
        return blocked

    def _judge(self, p: _Pass, results: CUDResults[Employee]) -> tuple[dict[str, _Verdict], set[str]]:
        """Each pod's verdict from what the provider confirmed, and the pods a confirmed item
        ``serves()`` (for the readiness gates)."""
        verdicts: dict[str, _Verdict] = {}
        serves: set[str] = set()

        def judge(name: str, verdict: _Verdict) -> None:
            if name:
                verdicts[name] = max(verdicts.get(name, _Verdict.IDLE), verdict)

        def confirmed(item: Employee, held: Employee) -> _Verdict:
            if not held.registered():
                return _Verdict.IDLE
            ready = isinstance(item.statuses, PodEmployeeStatuses) and item.statuses.lifecycle_ready
            if ready and held.serves():
                serves.add(item.name)
            return _Verdict.SERVED if ready else _Verdict.ROUTING

        for item in [*results.succ_created, *results.succ_updated]:
            judge(item.name, confirmed(item, item))
        for item in results.unchanged:
            # The provider's own item says whether it holds a registration.
            held = p.current_by_id.get(item.id)
            judge(item.name, confirmed(item, held if held is not None else item))
        for item in results.succ_deleted:
            judge(item.name, _Verdict.IDLE)
        for item in [*results.fail_created, *results.fail_updated, *results.fail_deleted]:
            judge(item.name, _Verdict.UNKNOWN)
        return verdicts, serves

    def _plan_after_calls(self, p: _Pass, judged: dict[str, _Verdict]) -> None:
        """Plan each pod's guard and lifecycle finalizer from what the provider confirmed."""
        verdicts = dict(judged)
        # Pods carrying our finalizers that the provider holds nothing for: release them,
        # whatever removed their backends (delete_employer, a person, the provider).
        for name in p.carriers:
            verdicts.setdefault(name, _Verdict.IDLE)
        p.verdicts = verdicts
        for name, verdict in sorted(verdicts.items()):
            if verdict is _Verdict.SERVED:
                if not self._swapped(p, name, p.lifecycle_finalizer, p.guard_finalizer):
                    p.writer.swap(name, to_lifecycle=True)
            elif verdict is _Verdict.ROUTING:
                if not self._swapped(p, name, p.guard_finalizer, p.lifecycle_finalizer):
                    p.writer.swap(name, to_lifecycle=False)
            elif verdict is _Verdict.IDLE and name in p.carriers:
                p.writer.remove_finalizer(name, p.lifecycle_finalizer)
                p.writer.remove_finalizer(name, p.guard_finalizer)
        if self._records_lifecycle_finalizers():
            p.lifecycle_record = True

    def _swapped(self, p: _Pass, name: str, on: str, off: str) -> bool:
        """The pod already holds ``on`` without ``off`` (and the entry the lifecycle finalizer
        needs), and nothing else is planned for it: the swap would write nothing, so it is not
        planned (a steady pass over 1000 served pods plans nothing). Anything unusual (a
        deleting or uncached pod, a malformed annotation) goes through the writer as before."""
        if p.writer.planned(name):
            return False
        pod = self._pod(name, p.writer.namespace)
        if pod is None or lifecycle.is_deleting(pod):
            return False
        held = lifecycle.get_finalizers(pod)
        if on not in held or off in held:
            return False
        return on != p.lifecycle_finalizer or self._holds_entry(pod, p.expected_key)

    # -- pod writes and the employer's record annotations ---------------------------------------------------

    async def _write(self, p: _Pass) -> None:
        if p.writer.pending:
            p.written.merge(await p.writer.flush())
        written = p.written
        if (
            not written.done
            and not written.failed
            and p.expected_added_record is None
            and not p.lifecycle_record
        ):
            return
        annotations: dict[str, str] = {}
        if p.expected_added_record is not None:
            removed = {n for n in p.expected_removes if n in written.done and n not in written.deferred}
            kept = [n for n in p.expected_added_record if n not in removed]
            added = sorted(set(kept) | {n for n in p.expected_adds if n in written.done})
            # Compared as a set: the Go original writes the record unsorted, and a takeover
            # rewrites nothing only to re-sort it (docs/concepts.md, "The finalizers and what
            # they protect").
            if set(added) != set(p.expected_added_record):
                annotations[wire.EXPECTED_FINALIZER_ADDED_ANNOTATION] = ",".join(added)
        if p.deleting:
            p.expected_clean = all(
                n in written.done and n not in written.deferred for n in p.expected_removes
            ) and not any(self._still_carries(p, n) for n in p.carriers)
        if p.lifecycle_record:
            recorded = _record_list(p.employer, wire.LIFECYCLE_FINALIZER_RECORDED_ANNOTATION)
            having = sorted(
                n for n in {*recorded, *p.carriers, *written.finalizers} if self._carries_lifecycle(p, n)
            )
            if set(having) != set(recorded):  # a set, as above
                annotations[wire.LIFECYCLE_FINALIZER_RECORDED_ANNOTATION] = ",".join(having)
        if annotations and not p.stand_in:
            await self._patch_employer_annotations(p, annotations)
        entry_failures = {
            n: e for n, e in written.failed.items() if n in p.expected_adds | p.expected_removes
        }
        if entry_failures:
            name, err = sorted(entry_failures.items())[0]
            raise await self._pod_write_failed(
                p,
                EventReason.ENSURE_EXPECTED_FINALIZER_FAILED,
                f"ensure employees expected finalizer failed: pod {name}: {err}"
                + (f" (and {len(entry_failures) - 1} more pods)" if len(entry_failures) > 1 else ""),
                entry_failures,
            )
        if written.failed:
            name, err = sorted(written.failed.items())[0]
            raise await self._pod_write_failed(
                p,
                EventReason.SYNC_EMPLOYEES_FAILED,
                f"sync employees failed: ensureLifecycleFinalizer failed, err: pod {name}: {err}",
                written.failed,
            )

    async def _pod_write_failed(
        self, p: _Pass, reason: EventReason, message: str, failed: Mapping[str, BaseException]
    ) -> ReconcileError:
        """Pod writes that failed: conflicts only (other writers of the same pods) are left to
        the retry until the same pod outlasts it; anything else is a Warning at once."""
        if all(isinstance(err, kube.Conflict) for err in failed.values()):
            return await self._fail_unless_retrying(
                p, reason, message, [("conflict", str(reason), name) for name in sorted(failed)]
            )
        return await self._fail(p, reason, message)

    # -- readiness gates (docs/zero-downtime.md) ------------------------------------------------------------

    def _gated_pods(self, namespace: str, gate: str) -> list[tuple[str, KubeObject]]:
        """(employee name, pod) of the cached pods whose ``spec.readinessGates`` holds ``gate``.

        A scan of the namespace's cached pods (in memory): a pod the employer stopped selecting
        keeps its gate, and only such a scan finds it."""
        if self._in_members():
            return [
                (f"{pod['metadata']['name']}{wire.MULTI_CLUSTER_SEPARATOR}{cluster}", pod)
                for cluster, (_, reader) in sorted(self.clusters.items())
                for pod in reader.list(kube.POD, namespace)
                if gate in lifecycle.readiness_gates(pod)
            ]
        return [
            (pod["metadata"]["name"], pod)
            for pod in self.reader.list(kube.POD, namespace)
            if gate in lifecycle.readiness_gates(pod)
        ]

    def _describe_employer(self, employer: KubeObject) -> str:
        kind = employer.get("kind") or self.employer_resource.kind
        return f"{kind} {kube.object_key(employer)}"

    async def _employed(self, p: _Pass) -> set[str] | None:
        """The pods this employer employs: those the adapter expects to hold, and those it
        selects; None when the pass could not tell.

        The selection is read afresh, after the caller listed the gated pods: a pod created
        during the pass is in the cache by then, so it is never taken for one the employer
        stopped selecting (which would open its gate before the provider serves it)."""
        if not p.employees_synced:
            return None
        try:
            selected = await self._selected_names(p, fresh=True)
        except Exception as err:
            log.info("%s %s: readiness gates: selected pods unknown: %s", self.name, p.key, err)
            return None
        return p.employed | set(selected)

    async def _update_gates(self, p: _Pass) -> None:
        """Set this employer's readiness gate on every live pod that carries it: True once the
        provider confirmed it serves the pod, False while it does not, True when the employer is
        deleting or no longer employs the pod, and True after the employer's fail-safe timeout
        (with a Warning Event on the pod). Only changed conditions are written."""
        if not self.employees_are_pods:
            return
        meta = p.employer["metadata"]
        namespace = str(meta.get("namespace") or "")
        gate = lifecycle.readiness_gate(meta["name"])
        pods = [(n, pod) for n, pod in self._gated_pods(namespace, gate) if not lifecycle.is_deleting(pod)]
        if not pods:
            return
        try:
            timeout = None if p.deleting else gates.gate_timeout(p.employer)
        except gates.InvalidAnnotation as err:
            await self.recorder.event(
                p.employer,
                "Warning",
                EventReason.UPDATE_READINESS_GATES_FAILED,
                f"{err}; the fail-safe is off",
            )
            timeout = None
        employed = await self._employed(p)
        who = self._describe_employer(p.employer)
        now = datetime.datetime.now(datetime.UTC)
        changes: list[tuple[str, KubeObject, gates.GateState]] = []
        for name, pod in pods:
            serving: bool | None = None
            if p.employees_synced and name not in p.unknown:
                serving = name in p.serving
            decision = gates.decide(
                pod,
                gate,
                employer=who,
                employer_deleting=p.deleting,
                employed=None if employed is None else name in employed,
                serving=serving,
                timeout=timeout,
                now=now,
                refused=p.refused.get(name),
            )
            if decision.recheck_after is not None:
                # A second more than the time left: the next pass finds the timeout run out.
                recheck = decision.recheck_after + 1.0
                p.gate_recheck = recheck if p.gate_recheck is None else min(p.gate_recheck, recheck)
            if decision.want is not None and not decision.want.matches(lifecycle.pod_condition(pod, gate)):
                changes.append((name, pod, decision.want))
        p.gate_failures = await self._write_gates(namespace, gate, changes, now)

    async def _write_gates(
        self,
        namespace: str,
        gate: str,
        changes: Sequence[tuple[str, KubeObject, gates.GateState]],
        now: datetime.datetime,
    ) -> dict[str, BaseException]:
        """Write each changed gate condition (status subresource); the failures by pod."""
        limit = asyncio.Semaphore(8)
        failures: dict[str, BaseException] = {}

        async def one(name: str, pod: KubeObject, want: gates.GateState) -> None:
            where = self._locate(name)
            body = gates.condition_patch(pod, gate, want, now)
            write = functools.partial(where.client.patch, patch_type="strategic", subresource="status")
            async with limit:
                try:
                    await asyncio.to_thread(write, kube.POD, namespace, where.name, body)
                except kube.NotFound:
                    return  # the pod is gone: nothing left to gate
                except Exception as err:
                    failures[name] = err
                    return
            log.info(
                "%s: pod %s: readiness gate %s %s (%s)",
                *(self.name, name, gate, want.status, want.reason),
                extra={"pod": name},
            )
            if want.reason is wire.GateReason.TIMEOUT:
                await self.recorder.event(
                    {**pod, "apiVersion": "v1", "kind": "Pod"}, "Warning", want.reason, want.message
                )

        await asyncio.gather(*(one(n, pod, want) for n, pod, want in changes))
        return failures

    async def _release_gates_of_gone_employer(self, namespace: str, name: str) -> None:
        """The employer is gone: its gate goes True on every pod still waiting on it, so no pod
        stays un-Ready for ever (docs/zero-downtime.md)."""
        gate = lifecycle.readiness_gate(name)
        want = gates.GateState(
            True,
            wire.GateReason.EMPLOYER_DELETED,
            f"{self.employer_resource.kind} {namespace}/{name} is deleted",
        )
        changes = [
            (n, pod, want)
            for n, pod in self._gated_pods(namespace, gate)
            if not lifecycle.is_deleting(pod)
            and (lifecycle.pod_condition(pod, gate) or {}).get("status") != "True"
        ]
        failures = await self._write_gates(namespace, gate, changes, datetime.datetime.now(datetime.UTC))
        if failures:
            pod, err = sorted(failures.items())[0]
            raise ReconcileError(
                EventReason.UPDATE_READINESS_GATES_FAILED,
                f"update readiness gates of deleted {namespace}/{name} failed: pod {pod}: {err}",
            )

    def _final_finalizers(self, p: _Pass, name: str) -> list[str]:
        """A pod's finalizers after this pass's writes (from the write, else from the cache)."""
        if name in p.written.finalizers:
            return p.written.finalizers[name]
        if name in p.written.done and name not in p.written.failed:
            return []  # written to and found gone
        pod = self._pod(name, p.writer.namespace)
        return lifecycle.get_finalizers(pod) if pod is not None else []

    def _still_carries(self, p: _Pass, name: str) -> bool:
        return self._guarded(p, self._final_finalizers(p, name))

    def _carries_lifecycle(self, p: _Pass, name: str) -> bool:
        return p.lifecycle_finalizer in self._final_finalizers(p, name)

    async def _patch_employer_annotations(self, p: _Pass, annotations: dict[str, str]) -> None:
        meta = p.employer["metadata"]
        try:
            patched, _ = await asyncio.to_thread(
                functools.partial(self.client.patch_optimistic, current=p.employer),
                self.employer_resource,
                meta.get("namespace"),
                meta["name"],
                lambda fresh: {"metadata": {"annotations": annotations}},
            )
        except ApiError as err:
            message = f"sync employees failed: patch record annotations failed, err: {err}"
            if isinstance(err, kube.Conflict):
                failure = ("conflict", str(EventReason.SYNC_EMPLOYEES_FAILED), "")
                retrying = await self._fail_unless_retrying(
                    p, EventReason.SYNC_EMPLOYEES_FAILED, message, [failure]
                )
                # Its cause is the retry it asks for (errors.steering reads the cause chain).
                raise retrying from retrying.__cause__
            raise await self._fail(p, EventReason.SYNC_EMPLOYEES_FAILED, message) from err
        if patched is not None:
            p.employer = patched

    # -- 6. release the clean finalizer ---------------------------------------------------------------

    async def _release_clean_finalizer(self, p: _Pass) -> None:
        if not p.deleting:
            return
        employer_clean = _is_clean(p.employer_results)
        employee_clean = _is_clean(p.employee_results)
        if not (employer_clean and employee_clean and p.expected_clean):
            return
        if p.stand_in:
            p.collected = True
            self._tell(p.key, "", "employer_deleted")
            return
        obsolete = [wire.CLEAN_FINALIZER, self._old_clean_finalizer(p.employer)]
        try:
            if not await self._patch_employer_finalizers(p.employer, remove=obsolete):
                return
        except Exception as err:
            raise await self._fail(
                p,
                EventReason.CLEAN_EMPLOYER_CLEAN_FINALIZER_FAILED,
                f"clean employer clean-finalizer failed: {err}",
            ) from err
        log.info("%s %s: provider side clean, released clean finalizer", self.name, p.key)
        self._tell(p.key, "", "employer_deleted")
        await self.recorder.event(
            p.employer,
            "Normal",
            EventReason.CLEAN_EMPLOYER_CLEAN_FINALIZER_SUCCEED,
            "clean employer clean finalizer succeed",
        )


@dataclass(frozen=True)
class _Side:
    """One side of the sync: its name in messages and its Event reasons."""

    what: str
    expected_reason: EventReason
    current_reason: EventReason
    sync_reason: EventReason


_EMPLOYER = _Side(
    "employer",
    EventReason.GET_EXPECTED_EMPLOYER_FAILED,
    EventReason.GET_CURRENT_EMPLOYER_FAILED,
    EventReason.SYNC_EMPLOYER_FAILED,
)
_EMPLOYEES = _Side(
    "employees",
    EventReason.GET_EXPECTED_EMPLOYEES_FAILED,
    EventReason.GET_CURRENT_EMPLOYEES_FAILED,
    EventReason.SYNC_EMPLOYEES_FAILED,
)


class _SyncError(ResourceConsistError):
    """create/update/delete raised; the message is the Go frame's ``syncX failed, err: ...``."""


ItemT = TypeVar("ItemT", Employer, Employee)


#: Runs between the diff and the calls: guards pods, returns the ids of creates/updates to hold back.
_BeforeCalls = Callable[[_Pass, Diff[Any], Sequence[Any]], Awaitable[set[str]]]


async def _sync(
    p: _Pass,
    expected: Sequence[ItemT],
    current: Sequence[ItemT],
    create: Callable[..., Any],
    update: Callable[..., Any],
    delete: Callable[..., Any],
    what: str,
    before_calls: _BeforeCalls | None = None,
) -> CUDResults[ItemT]:
    """Diff, then create, update, delete; an error aborts, failed items do not.

    Items ``before_calls`` holds back count as failed (so the employer is looked at again)."""
    try:
        planned = diff(expected, current)
    except Exception as err:
        raise _SyncError(f"diff {what} failed, err: {err}") from err
    p.current_by_id = {item.id: item for item in current}
    held_back: set[str] = await before_calls(p, planned, current) if before_calls is not None else set()
    results: CUDResults[ItemT] = CUDResults(unchanged=list(planned.unchanged))
    results.fail_created = [i for i in planned.to_create if i.id in held_back]
    results.fail_updated = [i for i in planned.to_update if i.id in held_back]
    planned.to_create = [i for i in planned.to_create if i.id not in held_back]
    planned.to_update = [i for i in planned.to_update if i.id not in held_back]
    for label, fn, items in (
        ("syncCreate", create, planned.to_create),
        ("syncUpdate", update, planned.to_update),
        ("syncDelete", delete, planned.to_delete),
    ):
        try:
            succeeded, failed = await call_adapter(fn, p.ctx, p.employer, list(items)) if items else ([], [])
        except Exception as err:
            raise _SyncError(f"{label} failed, err: {err}") from err
        if label == "syncCreate":
            results.succ_created = list(succeeded)
            results.fail_created += list(failed)
        elif label == "syncUpdate":
            results.succ_updated = list(succeeded)
            results.fail_updated += list(failed)
        else:
            results.succ_deleted, results.fail_deleted = list(succeeded), list(failed)
    return results


def _is_clean(results: CUDResults[Any]) -> bool:
    """Nothing expected remains on the provider and no delete failed (Go's ``isClean``)."""
    return not (
        results.unchanged
        or results.succ_created
        or results.fail_created
        or results.succ_updated
        or results.fail_updated
        or results.fail_deleted
    )


def _log_changes(controller: str, key: str, what: str, results: CUDResults[Any]) -> None:
    counts = {
        "created": len(results.succ_created),
        "updated": len(results.succ_updated),
        "deleted": len(results.succ_deleted),
        "failed": len(results.fail_created) + len(results.fail_updated) + len(results.fail_deleted),
    }
    if any(counts.values()):
        log.info("%s %s: %s %s", controller, key, what, " ".join(f"{k}={v}" for k, v in counts.items() if v))
